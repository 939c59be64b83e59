"""Evaluation: the conductor against every worker alone, on a fixed eval slice, and why it differs.

`slices` cuts the eval slice and checks it against training questions; `routers` are the baseline
routers (best single, random, oracle, W-router, W-cascade); `vote` is the broadcast-and-vote
majority; `arms` runs any arm through the orchestrator; `lineup` builds one run's arms once (their
names key the run) and runs them; `frames` turns the recorded workflows into accuracy with
intervals, cost, usage and the gap decomposition; `comparisons` pairs every arm with the best
single worker; `costs` sweeps the routers' cost knobs (over the run's recorded
`routing_predictions`) and finds the frontier; `markdown` writes the
markdown and `plots` the figures; the `eval_tables` module builds all that the `eval_tables` asset
publishes. Feeds `eval_arms` and `eval_tables`.
"""
