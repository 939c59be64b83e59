-- Every top-level rollout of one training run with what it chose and what it was shown: its step,
-- question, parse code, workers (real names, in step order), the catalogue its prompt listed and
-- whether it was right. Parameters: $run_id.
SELECT training_step, rollout, question_id, parse_code, workers, catalogue, correct, infra_failure
FROM workflows
WHERE run_id = $run_id AND parent_workflow_id IS NULL AND training_step IS NOT NULL
ORDER BY training_step, rollout;
