-- Questions a conductor was run on outside evaluation runs (training rollouts, probes of the
-- conductor): none of them may appear in an eval slice. Parameters: $eval_prefix, the prefix of
-- evaluation run ids.
SELECT DISTINCT question_id
FROM calls
WHERE kind = 'conductor' AND NOT starts_with(run_id, $eval_prefix)
ORDER BY question_id;
