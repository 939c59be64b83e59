-- The `calls` rows whose verdict another grader gave, with the gold of their question (NULL when
-- the question is not in `questions`). Parameters: $version (the current grader), $pool (NULL: any).
SELECT c.call_id, c.kind, c.status, c.response, c.extracted_answer, c.correct, c.grader_version,
       c.question_id, q.answer AS gold
FROM calls AS c
LEFT JOIN questions AS q USING (question_id)
WHERE c.correct IS NOT NULL
  AND c.grader_version IS DISTINCT FROM $version
  AND ($pool IS NULL OR c.pool = $pool)
ORDER BY c.call_id;
