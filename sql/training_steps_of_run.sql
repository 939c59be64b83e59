-- Every logged step of one training or probe run, in order (the curves of its asset). Parameters: $run_id.
SELECT run_id, step, phase, reward_mean, reward_std, frac_zero_std, parse_fail_rate, parse_codes,
       group_size, completion_length, loss, learning_rate, infra_excluded, frac_groups_no_signal,
       frac_same_correctness
FROM training_steps
WHERE run_id = $run_id
ORDER BY step;
