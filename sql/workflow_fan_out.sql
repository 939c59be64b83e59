-- Per top-level workflow of one run (an evaluation or a training run): whether it fans out and
-- aggregates, i.e. it parsed and its final step is an aggregator seat that saw at least two earlier
-- steps (that step's calls.visible_steps). The final step's call is joined by (run_id, workflow_id,
-- step, worker). Calls of a recursive step's inner workflow are filed under the top-level
-- workflow_id with their own step indices, so one of them can share that key: any matching call
-- that saw two or more results counts.
-- Parameters: $run_id, $aggregators (the pool's vote seats, a non-empty list of names).
SELECT
    w.workflow_id,
    any_value(w.arm) AS arm,
    any_value(w.training_step) AS step,
    any_value(w.infra_failure) AS infra_failure,
    coalesce(bool_or(w.parse_code = 'ok' AND list_contains($aggregators, w.workers[-1]) AND c.visible_steps >= 2), false)
        AS fans_out
FROM workflows AS w
LEFT JOIN calls AS c
    ON c.run_id = w.run_id AND c.workflow_id = w.workflow_id AND c.kind = 'step'
    AND c.step = w.n_steps - 1 AND c.worker = w.workers[-1]
WHERE w.run_id = $run_id
GROUP BY w.workflow_id
ORDER BY w.workflow_id;
