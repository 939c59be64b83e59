"""Probing: what each worker can do alone, and whether routing can pay on the pool at all.

`runner` issues every (question, worker, sample) probe call, resumably; `pass_rates` turns the
calls into per-question rates with intervals; `ceilings` gives oracle ceilings and the null pool;
`contested` picks the contested set that GRPO trains on; `reports` renders their results as
the markdown tables the assets publish and `plots` draws the pass-rate histograms; `pool_search`
looks for a pool with real headroom and `pool_search_report` writes what it found. Feeds
`probe_calls`, `pass_rates`, `oracle_ceilings`, `contested_set` and `pool_search`.
"""
