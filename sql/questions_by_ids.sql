-- The questions with the given ids (the contested set's, for the GRPO dataset). Parameters: $ids (VARCHAR[]).
SELECT question_id, corpus, split, problem, answer, subject, level, in_math500
FROM questions
WHERE list_contains($ids::VARCHAR[], question_id)
ORDER BY question_id;
