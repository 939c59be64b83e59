-- Drop every workflow a run logged (with delete_run_calls, which runs first). Parameters: $run_id.
DELETE FROM workflows WHERE run_id = $run_id;
