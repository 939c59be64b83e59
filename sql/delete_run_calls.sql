-- Drop every call a run logged (a probe run's or a parse check's rollout steps) before the same run,
-- identified by what it computes, runs again after an interruption. Parameters: $run_id.
DELETE FROM calls WHERE run_id = $run_id;
