-- Tokens per top-level workflow of one evaluation run: every call of the workflow (its steps and
-- its conductor call) and of the workflows a conductor seat wrote inside it (their calls carry
-- their own workflow id, whose row names the top-level one), and whether any of those counts
-- (and so their cost) was estimated rather than reported by a provider. Parameters: $run_id.
SELECT coalesce(w.root_workflow_id, c.workflow_id) AS workflow_id,
       sum(coalesce(c.prompt_tokens, 0) + coalesce(c.completion_tokens, 0))::DOUBLE AS tokens,
       bool_or(coalesce(c.tokens_estimated, FALSE)) AS tokens_estimated
FROM calls AS c
LEFT JOIN workflows AS w ON w.workflow_id = c.workflow_id
WHERE c.run_id = $run_id AND c.workflow_id IS NOT NULL
GROUP BY ALL;
