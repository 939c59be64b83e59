-- Drop every training step a run logged (a probe run about to be repeated). Parameters: $run_id.
DELETE FROM training_steps WHERE run_id = $run_id;
