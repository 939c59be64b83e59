"""Training: from the contested set to a GRPO checkpoint of the conductor.

`settings` holds every GRPO/SFT/LoRA knob once (defaults are the paper's; cpu, cpu-smollm2 and gpu
profiles); `dataset` is what GRPO trains on (the contested set's files, world-model pruning and
its audit); `reward` is the paper's 0 / 0.5 / 1 reward as a TRL reward function; `rollouts` builds
the prompt rows (randomised sub-pools), executes sampled workflows on the pool and samples a
policy for parse checks; `telemetry` records every rollout in `workflows` and `calls` and reads
them back; `synthetic` and `tiny_models` make the offline CPU conductor learnable; `pretrained`
fetches and converts SmolLM2-135M-Instruct, the real pretrained model of the cpu-smollm2 profile;
`sft` is the warm start; `gates` is the zero-variance gate and the probe manifest it judges;
`grpo` runs TRL's GRPOTrainer with checkpoints and resume; `runs` is one GRPO run of the
conductor on its pool with its `training_steps` rows, and what the run left (first half against
second half); `stages` is the probe (run once for its inputs, read back after) and the training
run (resumed), each one call on a `GRPORun`. Feeds `warm_start_policy`, `grpo_probe_run` (and its gate) and `conductor_checkpoint`.
"""
