"""Probing: what each worker can do alone, and whether routing can pay on the pool at all.

`runner` issues every (question, worker, sample) probe call, resumably; `pass_rates` turns the
calls into per-question rates with intervals; `ceilings` gives oracle ceilings and the null pool;
`calibration` picks the contested set that GRPO trains on; `reports` renders their results as
the markdown tables the assets publish. Feeds `probe_calls`, `pass_rates`,
`oracle_ceilings` and `contested_set`.
"""
