-- Drop the calls of a run's rollouts of optimizer steps after $step (run before
-- delete_rollouts_after, which drops the workflows these calls are found by). Parameters: $run_id, $step.
DELETE FROM calls
WHERE run_id = $run_id
  AND workflow_id IN (SELECT workflow_id FROM workflows WHERE run_id = $run_id AND training_step > $step);
