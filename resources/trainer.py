"""The trainer resource: which policy is trained, on which profile, and where its files go.

One typed place for the knobs the training assets share (profile, policy, group size, steps,
reward variant, randomised pools, warm start, the gate threshold), turned into the library's
`GRPOSettings` / `SFTSettings`. The CPU profile is the embedded default (a tiny offline model);
the GPU profile is the paper's run (Qwen2.5-Instruct, vLLM rollouts). Nothing secret lives here.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from conductor_pipeline.paths import ARTIFACTS_DIR
from conductor_pipeline.training.gates import ZERO_VARIANCE_THRESHOLD
from conductor_pipeline.training.settings import (
    CPU_POLICY_HIDDEN_SIZE,
    CPU_POLICY_LAYERS,
    PAPER_POLICY,
    TINY_POLICY,
    GRPOSettings,
    SFTSettings,
)
from conductor_pipeline.training.synthetic import SyntheticStyle
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.world_model.hooks import PRUNE_HIGH, PRUNE_LOW

DEFAULT_OUTPUT_ROOT = ARTIFACTS_DIR / "training"
# Synthetic warm-start pairs: 160 steps x 8 see each 5 times; measured better than 960 pairs seen once.
DEFAULT_SFT_EXAMPLES = 256
# In-context examples in the conductor prompt: the paper's 4 on GPU; none on CPU, where the tiny
# model's prompt length is its main cost and the warm start teaches the format instead.
CPU_PROMPT_EXAMPLES = 0
GPU_PROMPT_EXAMPLES = 4
# Warm-start targets: the paper's shapes with a reasoning line for instruct models; the compact
# lists-only style for the tiny CPU model (why: conductor_pipeline.synthetic's docstring).
CPU_SYNTHETIC_STYLE: SyntheticStyle = "compact"
GPU_SYNTHETIC_STYLE: SyntheticStyle = "paper"
# Skipped questions the probe samples anyway (no gradient) to audit the pruning decision.
PRUNE_AUDIT_QUESTIONS = 8


class TrainerResource(dg.ConfigurableResource):
    """GRPO/SFT configuration of the conductor, per profile (cpu | gpu)."""

    profile: Literal["cpu", "gpu"] = Field("cpu", description="cpu: tiny offline policy (CI, laptops); gpu: Qwen2.5 + vLLM")
    output_root: str = Field(str(DEFAULT_OUTPUT_ROOT), description="Root folder of models, probe runs, gate verdicts and checkpoints")
    policy_model: str | None = Field(
        None, description=f"Hub id or local path; empty: '{TINY_POLICY}' on cpu, {PAPER_POLICY} on gpu"
    )
    reward_variant: Literal["paper", "strict"] = Field(
        "paper", description="paper: 0 unparseable / 0.5 parsed wrong / 1 correct; strict: 0 / 0 / 1"
    )
    randomize_pools: bool = Field(True, description="Each question shows a random subset of the pool (the paper)")
    naming: Literal["ordinal", "names"] = Field("ordinal", description="Workers shown as 'Model 0..k' (paper) or by name")
    prompt_examples: int | None = Field(
        None, ge=0, description=f"In-context example workflows; empty: {CPU_PROMPT_EXAMPLES} on cpu, {GPU_PROMPT_EXAMPLES} on gpu"
    )
    probe_steps: int = Field(20, ge=1, description="Steps of the zero-variance probe run (the reproduction: 20)")
    train_steps: int | None = Field(None, ge=1, description="GRPO steps of the full run; empty: the profile's (cpu 24, gpu 200)")
    group_size: int | None = Field(None, ge=2, description="Rollouts per question; empty: the profile's (cpu 8, gpu 64)")
    questions_per_step: int | None = Field(None, ge=1, description="Questions per step; empty: the profile's (cpu 2, gpu 4)")
    max_completion_length: int | None = Field(None, ge=8, description="Token cap per rollout; empty: the profile's")
    learning_rate: float | None = Field(None, gt=0, description="Empty: the profile's (cpu 1e-4, gpu 1e-6)")
    save_steps: int = Field(10, ge=1, description="Checkpoint every N steps; a rerun resumes from the latest")
    vllm_mode: Literal["colocate", "server"] = Field("colocate", description="gpu: vLLM shares the GPU, or a `trl vllm-serve` server")
    vllm_server_base_url: str | None = Field(None, description="gpu + server mode: base URL of `trl vllm-serve`")
    sft_warm_start: bool = Field(True, description="Supervised warm start on synthetic valid workflows before GRPO")
    sft_examples: int = Field(DEFAULT_SFT_EXAMPLES, ge=1, description="Synthetic warm-start pairs")
    sft_steps: int | None = Field(None, ge=1, description="Warm-start optimizer steps; empty: the profile's")
    sft_learning_rate: float | None = Field(None, gt=0, description="Warm-start learning rate; empty: the profile's")
    synthetic_style: Literal["auto", "paper", "compact"] = Field(
        "auto", description=f"Warm-start targets; auto: '{CPU_SYNTHETIC_STYLE}' on cpu, '{GPU_SYNTHETIC_STYLE}' on gpu"
    )
    contested_subpools: bool = Field(
        True,
        description="Random sub-pools show one of each question's best and one of its worst workers (cached pass "
        "rates), so every prompt keeps the routing decision it was chosen for",
    )
    prune_with_world_model: bool = Field(
        False,
        description="Drop questions the world model predicts every worker solves (or none does) from the GRPO "
        "dataset of the probe and of training; needs the world_model asset",
    )
    world_model_bonus_weight: float = Field(
        0.0,
        ge=0,
        description="Reward bonus weight * max(0, correct - W's P(success) of the final worker); 0 = off (default). "
        "The last and most careful use of W: it rewards W's mistakes as much as good routing; needs the world_model asset",
    )
    prune_low: float = Field(PRUNE_LOW, ge=0, le=1, description="Pruning: 'none solves' when every P(success) is below")
    prune_high: float = Field(PRUNE_HIGH, ge=0, le=1, description="Pruning: 'all solve' when every P(success) is above")
    prune_audit_questions: int = Field(
        PRUNE_AUDIT_QUESTIONS, ge=0, description="Pruning: skipped questions the probe still samples to audit the skip"
    )
    time_limit_s: float | None = Field(
        None, gt=0, description="Stop GRPO early after this many seconds (it still writes a final checkpoint)"
    )
    zero_variance_threshold: float = Field(
        ZERO_VARIANCE_THRESHOLD, gt=0, le=1, description="The gate passes only if the flat-group fraction is strictly below"
    )
    seed: int = Field(0, description="Seed of sampling, data order, pool randomisation and synthetic pairs")

    # ------------------------------------------------------------------ settings

    def grpo_settings(self, *, steps: int | None = None) -> GRPOSettings:
        """The profile's GRPOSettings with this resource's overrides (`steps` overrides train_steps)."""
        overrides: dict[str, object] = {
            "reward_variant": self.reward_variant,
            "world_model_bonus_weight": self.world_model_bonus_weight,
            "randomize_pools": self.randomize_pools,
            "save_steps": self.save_steps,
            "seed": self.seed,
        }
        for name, value in (
            ("num_generations", self.group_size),
            ("questions_per_step", self.questions_per_step),
            ("max_completion_length", self.max_completion_length),
            ("learning_rate", self.learning_rate),
            ("max_steps", steps or self.train_steps),
        ):
            if value is not None:
                overrides[name] = value
        if self.profile == "gpu":
            settings = GRPOSettings.gpu_profile(self.policy_model or PAPER_POLICY, vllm_mode=self.vllm_mode)
            if self.vllm_server_base_url:
                overrides["vllm_server_base_url"] = self.vllm_server_base_url
        else:
            settings = GRPOSettings.cpu_profile()
            if self.policy_model:
                overrides["policy_model"] = self.policy_model
        settings = replace(settings, **overrides)
        # One optimizer step per generation batch needs batch | rollouts; shrink the micro-batch if not.
        if settings.rollouts_per_step % (settings.per_device_train_batch_size * settings.num_processes):
            settings = replace(settings, per_device_train_batch_size=settings.rollouts_per_step // settings.num_processes)
        return settings

    def sft_settings(self) -> SFTSettings:
        base = SFTSettings.gpu_profile() if self.profile == "gpu" else SFTSettings.cpu_profile()
        overrides = {"max_steps": self.sft_steps, "learning_rate": self.sft_learning_rate}
        return replace(base, seed=self.seed, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def warm_start_style(self) -> SyntheticStyle:
        if self.synthetic_style != "auto":
            return self.synthetic_style
        return GPU_SYNTHETIC_STYLE if self.profile == "gpu" else CPU_SYNTHETIC_STYLE

    @property
    def n_prompt_examples(self) -> int:
        if self.prompt_examples is not None:
            return self.prompt_examples
        return GPU_PROMPT_EXAMPLES if self.profile == "gpu" else CPU_PROMPT_EXAMPLES

    # ------------------------------------------------------------------ paths

    def pool_dir(self, pool_name: str) -> Path:
        return Path(self.output_root) / pool_name

    def warm_start_dir(self, pool_name: str) -> Path:
        return self.pool_dir(pool_name) / "warm_start"

    def probe_dir(self, pool_name: str) -> Path:
        return self.pool_dir(pool_name) / "probe"

    def gate_path(self, pool_name: str) -> Path:
        return self.pool_dir(pool_name) / "gates" / "zero_variance_gate.json"

    def checkpoint_dir(self, pool_name: str) -> Path:
        return self.pool_dir(pool_name) / "grpo"

    def base_policy_path(self) -> Path | str:
        """The policy before any training: the tiny model (built offline, cached) or a hub id / path."""
        model = self.grpo_settings().policy_model
        if model == TINY_POLICY:
            return build_tiny_causal_lm(
                Path(self.output_root) / "models" / "tiny-conductor",
                hidden_size=CPU_POLICY_HIDDEN_SIZE,
                num_layers=CPU_POLICY_LAYERS,
                seed=self.seed,
            )
        return model

    def start_policy_path(self, pool_name: str) -> Path | str:
        """What GRPO starts from: the warm-started model when enabled, else the base policy."""
        return self.warm_start_dir(pool_name) if self.sft_warm_start else self.base_policy_path()

    def describe(self) -> dict[str, object]:
        """Knobs for metadata (no secrets exist here; endpoints are local URLs)."""
        return {"profile": self.profile, **self.grpo_settings().describe()}
