-- Per optimizer step of one training or probe run: its rollouts per outcome, a parse code or
-- 'infrastructure' (parsed, but a step hit a transient or unrecorded call: excluded from the
-- reward), the shape of training_steps.parse_codes. Parameters: $run_id.
SELECT
    training_step AS step,
    CASE WHEN infra_failure THEN 'infrastructure' ELSE parse_code END AS outcome,
    count(*) AS rollouts
FROM workflows
WHERE run_id = $run_id AND training_step IS NOT NULL AND parent_workflow_id IS NULL
GROUP BY ALL
ORDER BY step, outcome;
