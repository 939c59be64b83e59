-- Per top-level workflow of one run (an evaluation or a training run): whether it fans out and
-- aggregates, i.e. it parsed and its final step is an aggregator seat that saw at least two earlier
-- steps (that step's calls.visible_steps). The final step's call is the one row keyed by
-- (run_id, workflow_id, step, worker); workflows a conductor seat wrote inside this one
-- (recursion) have rows of their own and are left out here.
-- Parameters: $run_id, $aggregators (the pool's vote seats, a non-empty list of names).
SELECT
    w.workflow_id,
    w.arm,
    w.training_step AS step,
    w.infra_failure,
    coalesce(w.parse_code = 'ok' AND list_contains($aggregators, w.workers[-1]) AND c.visible_steps >= 2, false)
        AS fans_out
FROM workflows AS w
LEFT JOIN calls AS c
    ON c.run_id = w.run_id AND c.workflow_id = w.workflow_id AND c.kind = 'step'
    AND c.step = w.n_steps - 1 AND c.worker = w.workers[-1]
WHERE w.run_id = $run_id AND w.parent_workflow_id IS NULL
ORDER BY w.workflow_id;
