-- The oracle ceiling of a pool (CONTRACT: the columns and their meaning are relied on).
-- Input: a relation `outcomes(question_id, worker, correct)`, one row per question x worker,
-- which the caller filters to the pool. Only questions EVERY worker in it has an outcome for
-- (correct not NULL) count, so a worker with partial coverage cannot inflate or deflate it.
-- Returns one row:
--   n_questions  questions counted
--   best_worker  the worker with the highest accuracy on them (ties: the smallest name)
--   best_single  that accuracy (0..1)
--   oracle       share of questions at least one worker solved (0..1)
--   headroom     oracle - best_single: what perfect routing could add over the best worker alone
--   unsolved     questions no worker solved
WITH known AS (
    SELECT question_id, worker, correct
    FROM outcomes
    WHERE correct IS NOT NULL
),
covered AS (
    SELECT question_id
    FROM known
    GROUP BY question_id
    HAVING count(DISTINCT worker) = (SELECT count(DISTINCT worker) FROM known)
),
scored AS (
    SELECT known.*
    FROM known
    SEMI JOIN covered USING (question_id)
),
per_worker AS (
    SELECT worker, avg(CAST(correct AS DOUBLE)) AS accuracy
    FROM scored
    GROUP BY worker
),
best AS (
    SELECT worker, accuracy
    FROM per_worker
    ORDER BY accuracy DESC, worker ASC
    LIMIT 1
),
per_question AS (
    SELECT question_id, bool_or(correct) AS solved
    FROM scored
    GROUP BY question_id
),
oracle AS (
    SELECT
        count(*) AS n_questions,
        avg(CAST(solved AS DOUBLE)) AS oracle,
        count_if(NOT solved) AS unsolved
    FROM per_question
)
SELECT
    oracle.n_questions,
    best.worker AS best_worker,
    best.accuracy AS best_single,
    oracle.oracle,
    oracle.oracle - best.accuracy AS headroom,
    oracle.unsolved
FROM oracle
LEFT JOIN best ON TRUE;
