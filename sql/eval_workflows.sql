-- Every workflow row of one evaluation run (all arms and repeats). Parameters: $run_id.
SELECT workflow_id, run_id, question_id, conductor, parse_code, n_steps, workers, final_answer,
       correct, cost_usd, latency_s, arm, repeat, infra_failure
FROM workflows
WHERE run_id = $run_id
ORDER BY arm, repeat, question_id;
