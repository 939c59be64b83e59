"""Training: from the contested set to a GRPO checkpoint of the conductor.

`settings` holds every GRPO/SFT knob once (defaults are the paper's; cpu and gpu profiles);
`reward` is the paper's 0 / 0.5 / 1 reward as a TRL reward function; `rollouts` builds the prompt
rows (randomised sub-pools) and executes sampled workflows on the pool; `synthetic` and
`tiny_models` make the offline CPU conductor learnable; `sft` is the warm start; `gates` is the
zero-variance gate; `grpo` runs TRL's GRPOTrainer with checkpoints and resume. Feeds
`warm_start_policy`, `grpo_probe_run` (and its gate) and `conductor_checkpoint`.
"""
