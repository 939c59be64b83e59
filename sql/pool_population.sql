-- The questions a pool's oracle ceiling is measured on: probed questions of the pool on which every
-- worker with any scored outcome has one (the coverage rule of oracle_ceiling.sql), with corpus,
-- source split and level so the ceiling can say which questions it counted. Parameters: $pool, $workers (VARCHAR[]).
WITH known AS (
    SELECT DISTINCT question_id, worker
    FROM calls
    WHERE kind = 'probe' AND pool = $pool AND correct IS NOT NULL
      AND list_contains($workers::VARCHAR[], worker)
),
covered AS (
    SELECT question_id
    FROM known
    GROUP BY question_id
    HAVING count(DISTINCT worker) = (SELECT count(DISTINCT worker) FROM known)
)
SELECT q.question_id, q.corpus, q.split, q.level
FROM questions AS q
SEMI JOIN covered USING (question_id)
ORDER BY q.question_id;
