-- Where a conductor's gap to the best single worker comes from (issue 4, "Evaluation assets").
-- Inputs (the caller registers both):
--   outcomes(question_id, worker, correct)              one row per question x worker, solo arms
--   conductor_outcomes(question_id, parse_code, correct, workers)
--                                                       one row per question; `workers` is the
--                                                       list of worker names the workflow used
-- Only questions present in both relations count. Returns one row. Counts are integers
-- (n_questions, solvable, conductor_correct_on_solvable, solvable_*); the rest are fractions.
-- A question is "solvable" when some worker solves it solo; a parsed workflow "reached a
-- solver" when at least one of its workers is such a solver, else it used "only non-solvers".
-- The best worker is the most accurate solo worker on these questions (ties: smallest name).
WITH common AS (
    SELECT DISTINCT question_id FROM outcomes
    INTERSECT
    SELECT DISTINCT question_id FROM conductor_outcomes
),
solo AS (
    SELECT o.question_id, o.worker, coalesce(o.correct, FALSE) AS correct
    FROM outcomes AS o
    SEMI JOIN common USING (question_id)
),
per_worker AS (
    SELECT worker, avg(correct::INTEGER) AS accuracy
    FROM solo
    GROUP BY worker
),
best AS (
    SELECT worker, accuracy
    FROM per_worker
    ORDER BY accuracy DESC, worker ASC
    LIMIT 1
),
solvers AS (
    SELECT question_id, list(worker) FILTER (WHERE correct) AS solver_workers
    FROM solo
    GROUP BY question_id
),
per_question AS (
    SELECT
        c.question_id,
        c.parse_code = 'ok' AS parsed,
        coalesce(c.correct, FALSE) AS conductor_correct,
        coalesce(len(s.solver_workers), 0) > 0 AS is_solvable,
        coalesce(list_has_any(c.workers, s.solver_workers), FALSE) AS reached_solver
    FROM conductor_outcomes AS c
    SEMI JOIN common USING (question_id)
    LEFT JOIN solvers AS s USING (question_id)
),
totals AS (
    SELECT
        count(*) AS n_questions,
        avg(is_solvable::INTEGER) AS oracle,
        avg(conductor_correct::INTEGER) AS conductor,
        avg((NOT parsed)::INTEGER) AS unparseable,
        avg(conductor_correct::INTEGER) FILTER (WHERE parsed) AS parsed_accuracy,
        count_if(is_solvable) AS solvable,
        count_if(is_solvable AND conductor_correct) AS conductor_correct_on_solvable,
        count_if(is_solvable AND NOT parsed) AS solvable_unparseable,
        count_if(is_solvable AND parsed AND reached_solver) AS solvable_reached_solver,
        count_if(is_solvable AND parsed AND NOT reached_solver) AS solvable_only_non_solvers
    FROM per_question
)
SELECT
    t.n_questions::INTEGER AS n_questions,
    b.worker AS best_worker,
    b.accuracy AS best_single,
    t.oracle,
    t.conductor,
    t.conductor - b.accuracy AS gap,
    t.unparseable,
    t.parsed_accuracy,
    t.solvable::INTEGER AS solvable,
    t.conductor_correct_on_solvable::INTEGER AS conductor_correct_on_solvable,
    t.solvable_unparseable::INTEGER AS solvable_unparseable,
    t.solvable_reached_solver::INTEGER AS solvable_reached_solver,
    t.solvable_only_non_solvers::INTEGER AS solvable_only_non_solvers
FROM totals AS t
LEFT JOIN best AS b ON TRUE;
