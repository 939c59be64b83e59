-- One row per question x worker of one pool's probes: the `outcomes` view's majority rule
-- (strictly more than half of the scored samples correct) restricted to calls of that pool,
-- so two pools that share a worker name never mix. Parameters: $pool.
SELECT
    question_id,
    worker,
    2 * count_if(correct) > count(*) AS correct
FROM calls
WHERE kind = 'probe' AND pool = $pool AND correct IS NOT NULL
GROUP BY question_id, worker;
