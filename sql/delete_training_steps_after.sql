-- Drop the steps a killed run logged after its last checkpoint: the resumed run recomputes them,
-- and the idempotent insert would otherwise keep the lost trajectory's rows. Parameters: $run_id, $step.
DELETE FROM training_steps WHERE run_id = $run_id AND step > $step;
