-- Per top-level workflow of one run (an evaluation or a training run): whether it fans out and
-- aggregates, i.e. it parsed and its final step is an aggregator seat that saw at least two earlier
-- steps (that step's calls.visible_steps); how many model calls it made (steps of seats that are
-- not aggregators); and whether an agreeing vote skipped steps (`stop_when_first_agree`): the final
-- step's place in the written workflow (its calls.step) is then past the steps that ran
-- (workflows.n_steps). Workflows a conductor seat wrote inside this one (recursion) have rows of
-- their own and are left out here.
-- Parameters: $run_id, $aggregators (the pool's vote seats, a non-empty list of names).
WITH step_calls AS (
    SELECT
        workflow_id,
        max(step) AS last_step,
        count(*) FILTER (WHERE NOT list_contains($aggregators, worker)) AS model_calls
    FROM calls
    WHERE run_id = $run_id AND kind = 'step'
    GROUP BY workflow_id
)
SELECT
    w.workflow_id,
    w.arm,
    w.training_step AS step,
    w.infra_failure,
    w.correct,
    coalesce(w.parse_code = 'ok' AND list_contains($aggregators, w.workers[-1]) AND c.visible_steps >= 2, false)
        AS fans_out,
    coalesce(s.model_calls, 0) AS model_calls,
    coalesce(w.parse_code = 'ok' AND s.last_step >= w.n_steps, false) AS stopped_early
FROM workflows AS w
LEFT JOIN step_calls AS s ON s.workflow_id = w.workflow_id
LEFT JOIN calls AS c
    ON c.run_id = w.run_id AND c.workflow_id = w.workflow_id AND c.kind = 'step'
    AND c.step = s.last_step AND c.worker = w.workers[-1]
WHERE w.run_id = $run_id AND w.parent_workflow_id IS NULL
ORDER BY w.workflow_id;
