-- Tokens per workflow of one evaluation run: every call that carries the workflow id (its steps,
-- its conductor call and any recursive conductor calls), and whether any of those counts (and so
-- their cost) was estimated rather than reported by a provider. Parameters: $run_id.
SELECT workflow_id,
       sum(coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0))::DOUBLE AS tokens,
       bool_or(coalesce(tokens_estimated, FALSE)) AS tokens_estimated
FROM calls
WHERE run_id = $run_id AND workflow_id IS NOT NULL
GROUP BY workflow_id;
