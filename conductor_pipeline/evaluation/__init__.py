"""Evaluation: the conductor against every worker alone, on a fixed eval slice, and why it differs.

`slices` cuts the eval slice and checks it against training questions; `routers` are the baseline
arms (best single, random, oracle, W-router); `arms` runs any arm through the orchestrator;
`lineup` builds one run's arms once (their names key the run) and runs them; `tables` turns the
recorded workflows into accuracy with intervals, cost, usage and the gap decomposition. Feeds
`eval_arms` and `eval_tables`.
"""
