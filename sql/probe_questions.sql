-- The questions a probe run covers: the chosen corpora and splits, MATH restricted to the chosen
-- levels (GSM8K has none). Deterministic, well-mixed order so a `$limit` takes a fair sample.
-- Parameters: $corpora (VARCHAR[]), $splits (VARCHAR[]), $math_levels (INTEGER[]), $limit (BIGINT or NULL).
SELECT question_id, corpus, split, problem, answer, subject, level, in_math500
FROM questions
WHERE list_contains($corpora::VARCHAR[], corpus)
  AND list_contains($splits::VARCHAR[], split)
  AND (corpus <> 'math' OR list_contains($math_levels::INTEGER[], level))
ORDER BY md5(question_id)
LIMIT $limit;
