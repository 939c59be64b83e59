-- World-model training rows: every scored probe and workflow-step call with its question.
-- A call without a subtask text (a probe of the whole question) is a whole-question call;
-- `visible_steps` is how many earlier step results it saw. `source` says where the row comes from:
-- 'probe' (probe_calls), 'rollout' (a step of a training rollout: its workflow carries a training
-- phase) or 'eval' (a step of an evaluation workflow). Parameters: $pool, the pool whose runs wrote
-- the rows (NULL: every pool's). Pools that seat the same worker each probe it: read across pools,
-- its rows would count once per pool probed before.
SELECT
    c.question_id,
    c.worker,
    coalesce(c.subtask, q.problem) AS subtask,
    q.problem,
    q.corpus,
    q.subject,
    q.level,
    c.correct,
    c.cost_usd,
    c.latency_s,
    coalesce(c.tokens_estimated, FALSE) AS tokens_estimated,
    -- A probe always answers alone; a step written before the column existed stays unknown.
    coalesce(c.visible_steps, CASE WHEN c.kind = 'probe' THEN 0 END) AS visible_steps,
    CASE WHEN c.kind = 'probe' THEN 'probe' WHEN w.phase IS NOT NULL THEN 'rollout' ELSE 'eval' END AS source
FROM calls AS c
JOIN questions AS q USING (question_id)
LEFT JOIN workflows AS w ON w.workflow_id = c.workflow_id
WHERE c.kind IN ('probe', 'step')
  AND c.correct IS NOT NULL
  AND ($pool IS NULL OR c.pool = $pool)
ORDER BY c.question_id, c.worker, c.sample, c.call_id;
