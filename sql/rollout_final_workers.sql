-- Per optimizer step of one run: how many rollouts ended at each worker (the last step's worker,
-- whose answer is final), '(unparsed)' for workflows that did not parse. Parameters: $run_id.
SELECT
    training_step AS step,
    CASE WHEN parse_code = 'ok' THEN workers[-1] ELSE '(unparsed)' END AS final_worker,
    count(*) AS rollouts
FROM workflows
WHERE run_id = $run_id AND training_step IS NOT NULL AND parent_workflow_id IS NULL
GROUP BY ALL
ORDER BY step, final_worker;
