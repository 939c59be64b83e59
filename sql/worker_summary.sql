-- Per worker of one pool, over its calls of one kind: marginal accuracy (scored calls only), the
-- rate of each status over all calls, mean tokens, cost and latency. `tokens_estimated` says
-- whether any token count (and so cost) was estimated from text (replay).
-- Parameters: $pool, $kind ('probe' | 'step' | 'conductor').
SELECT
    worker,
    count(*) AS calls,
    count(correct) AS scored,
    count_if(correct)::BIGINT AS successes,  -- count_if gives HUGEINT, which reaches polars as Decimal
    successes / nullif(scored, 0) AS accuracy,
    avg(CAST(status = 'ok' AS DOUBLE)) AS ok_rate,
    avg(CAST(status = 'truncated' AS DOUBLE)) AS truncated_rate,
    avg(CAST(status = 'empty' AS DOUBLE)) AS empty_rate,
    avg(CAST(status = 'transient' AS DOUBLE)) AS transient_rate,
    avg(CAST(status = 'terminal' AS DOUBLE)) AS terminal_rate,
    avg(CAST(status = 'not_recorded' AS DOUBLE)) AS not_recorded_rate,
    avg(prompt_tokens) AS mean_prompt_tokens,
    avg(completion_tokens) AS mean_completion_tokens,
    coalesce(bool_or(tokens_estimated), FALSE) AS tokens_estimated,
    sum(cost_usd) AS total_cost_usd,
    avg(cost_usd) AS mean_cost_usd,
    avg(latency_s) AS mean_latency_s,
    max(sample) AS max_sample
FROM calls
WHERE kind = $kind AND pool = $pool
GROUP BY worker
ORDER BY worker;
