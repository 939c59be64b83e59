-- Per question x worker of one pool: the verdict of its lowest-indexed scored probe sample, i.e.
-- what a one-sample probe would have seen (the contested set reports how many questions k
-- samples move across the line). Parameters: $pool.
SELECT question_id, worker, arg_min(correct, sample) AS correct
FROM calls
WHERE kind = 'probe' AND pool = $pool AND correct IS NOT NULL
GROUP BY question_id, worker
ORDER BY question_id, worker;
