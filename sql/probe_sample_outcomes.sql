-- Every scored probe sample of one pool: the raw material of the null pool (independent samples
-- of one worker treated as if they were different workers). Parameters: $pool.
SELECT question_id, worker, sample, correct
FROM calls
WHERE kind = 'probe' AND pool = $pool AND correct IS NOT NULL;
