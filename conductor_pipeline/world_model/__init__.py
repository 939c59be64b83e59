"""The world model W(subtask, worker) -> P(success), expected cost, expected latency.

`data` builds its training frame (warehouse or recordings); `features` is the one feature builder
for fitting and scoring; `model` is the LightGBM model; `evaluation` tests it against marginal
baselines (`cross_validation`: settings, baselines, folds, out-of-fold predictions; `metrics`: the
scores, their question-bootstrap intervals and calibration) and as a router (`routing`);
`aggregator_steps` scores it on vote steps; `plots` draws its reliability diagram;
`prompts_and_pruning` holds the places the pipeline uses it (W's numbers in conductor prompts,
pruning GRPO questions). Feeds `world_model` and `world_model_report`, and the W-router eval arm.
"""
