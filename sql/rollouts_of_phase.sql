-- The top-level rollouts one phase of a run sampled (e.g. a warm start's parse check): what each
-- chose and the catalogue it was shown. Parameters: $run_id, $phase.
SELECT question_id, parse_code, workers, catalogue, correct
FROM workflows
WHERE run_id = $run_id AND phase = $phase AND parent_workflow_id IS NULL
ORDER BY workflow_id;
