-- The telemetry one training, probe or parse-check run left: its workflows (one per rollout) and
-- its calls by kind (the conductor's completions, the executed worker steps). Workflows a conductor
-- seat wrote inside a rollout (recursion) are not rollouts of their own. Parameters: $run_id.
SELECT
    (SELECT count(*) FROM workflows WHERE run_id = $run_id AND parent_workflow_id IS NULL) AS workflows,
    (SELECT count(*) FROM calls WHERE run_id = $run_id AND kind = 'conductor') AS conductor_calls,
    (SELECT count(*) FROM calls WHERE run_id = $run_id AND kind = 'step') AS step_calls;
