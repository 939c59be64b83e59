-- The highest probe sample index written for a pool (NULL when none): a re-probe starts above it.
-- Parameters: $pool.
SELECT max(sample) AS max_sample
FROM calls
WHERE kind = 'probe' AND pool = $pool;
