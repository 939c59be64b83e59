-- World-model training rows: every scored probe and workflow-step call with its question.
-- A call without a subtask text (a probe of the whole question) is a whole-question call;
-- `visible_steps` is how many earlier step results it saw.
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
    coalesce(c.visible_steps, CASE WHEN c.kind = 'probe' THEN 0 END) AS visible_steps
FROM calls AS c
JOIN questions AS q USING (question_id)
WHERE c.kind IN ('probe', 'step')
  AND c.correct IS NOT NULL
ORDER BY c.question_id, c.worker, c.sample, c.call_id;
