-- The `workflows` rows whose verdict another grader gave, with the gold of their question (the
-- caller looks up the response of each one's last step). Parameters: $version (the current
-- grader), $pool (NULL: any).
SELECT w.workflow_id, w.question_id, w.parse_code, w.n_steps, w.infra_failure, w.final_answer,
       w.correct, w.grader_version, q.answer AS gold
FROM workflows AS w
LEFT JOIN questions AS q USING (question_id)
WHERE w.correct IS NOT NULL
  AND w.grader_version IS DISTINCT FROM $version
  AND ($pool IS NULL OR w.workflow_id IN (SELECT workflow_id FROM calls WHERE pool = $pool))
ORDER BY w.workflow_id;
