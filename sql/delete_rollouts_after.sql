-- Drop a run's rollouts of optimizer steps after $step (their calls first, with
-- delete_rollout_calls_after): a resumed run samples those steps again, and the idempotent inserts
-- would otherwise keep the lost trajectory's rows. Parameters: $run_id, $step.
DELETE FROM workflows WHERE run_id = $run_id AND training_step > $step;
