-- Tokens per workflow of one evaluation run: every call that carries the workflow id (its steps,
-- its conductor call and any recursive conductor calls). Parameters: $run_id.
SELECT workflow_id,
       sum(coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0))::DOUBLE AS tokens
FROM calls
WHERE run_id = $run_id AND workflow_id IS NOT NULL
GROUP BY workflow_id;
