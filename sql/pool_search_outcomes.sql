-- Every scored probe sample of one pool with its cost: what the pool search reads when the pool was
-- probed through the warehouse (several samples per question make null pools possible).
-- Parameters: $pool.
SELECT
    question_id,
    worker,
    sample,
    correct,
    cost_usd,
    coalesce(tokens_estimated, FALSE) AS tokens_estimated
FROM calls
WHERE kind = 'probe' AND pool = $pool AND correct IS NOT NULL;
