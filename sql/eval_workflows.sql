-- Every top-level workflow row of one evaluation run (all arms and repeats); workflows a
-- conductor seat wrote inside them are in eval_inner_workflows. Parameters: $run_id.
SELECT workflow_id, run_id, question_id, conductor, parse_code, n_steps, workers, final_answer,
       correct, cost_usd, latency_s, arm, repeat, infra_failure, catalogue
FROM workflows
WHERE run_id = $run_id AND parent_workflow_id IS NULL
ORDER BY arm, repeat, question_id;
