-- Per question x worker: scored probe samples, successes and the pass rate, for one pool.
-- Unscored calls (transient, not_recorded) are not samples. Parameters: $pool.
SELECT
    question_id,
    worker,
    count(*) AS samples,
    count_if(correct)::BIGINT AS successes,  -- count_if gives HUGEINT, which reaches polars as Decimal
    successes / samples AS pass_rate
FROM calls
WHERE kind = 'probe' AND pool = $pool AND correct IS NOT NULL
GROUP BY question_id, worker
ORDER BY question_id, worker;
