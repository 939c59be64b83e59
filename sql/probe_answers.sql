-- Per question x worker of one pool: the extracted answer, verdict and cost of its lowest-indexed
-- scored probe sample (what a replay seat answers), for static policies computed from the recordings.
-- Parameters: $pool.
SELECT question_id, worker, arg_min(extracted_answer, sample) AS extracted_answer, arg_min(correct, sample) AS correct,
       arg_min(cost_usd, sample) AS cost_usd
FROM calls
WHERE kind = 'probe' AND pool = $pool AND correct IS NOT NULL
GROUP BY question_id, worker
ORDER BY question_id, worker;
