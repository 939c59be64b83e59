"""The trainer resource: which policy is trained, on which profile, and where its files go.

One typed place for the knobs the training assets share: a profile of the library's
`GRPOSettings` / `SFTSettings` plus overrides under the library's own field names and help text,
and the pipeline's own knobs (policy, prompt, warm start, pruning, the gate). Profiles: `cpu`, the
embedded default (a tiny offline model, seconds per step); `cpu-smollm2`, a real pretrained
instruct model (SmolLM2-135M-Instruct, fetched from the package index and converted once) with
the GPU profile's prompt, chat template and warm-start style at CPU sizes (minutes per step, run
on purpose); `gpu`, the paper's run (Qwen2.5-Instruct, vLLM rollouts). Nothing secret lives here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from conductor_pipeline.conductor.recursion import DEFAULT_MAX_DEPTH
from conductor_pipeline.devices import AUTO_DEVICE, DEVICE_HELP, DEVICE_PATTERN, resolve_device, select_cuda_device
from conductor_pipeline.paths import artifacts_root
from conductor_pipeline.pools.backends.vote import MIN_VOTE_INPUTS
from conductor_pipeline.training.dataset import TrainingSet
from conductor_pipeline.training.gates import GATE_ON_REWARD, GateOn
from conductor_pipeline.training.pretrained import smollm2_model
from conductor_pipeline.training.recipe import (
    DEFAULT_SFT_EXAMPLES,
    PARSE_CHECK_PROMPTS,
    PARSE_CHECK_SAMPLES,
    PROBE_STEPS,
    PROFILES,
    PRUNE_AUDIT_QUESTIONS,
    DataSettings,
    GateSettings,
    Profile,
    Recipe,
    WarmStartSettings,
)
from conductor_pipeline.training.runs import grpo_run_key
from conductor_pipeline.training.settings import (
    CPU_POLICY_HIDDEN_SIZE,
    CPU_POLICY_LAYERS,
    SMOLLM2_POLICY,
    TINY_POLICY,
    GRPOSettings,
    LoraSettings,
    SFTSettings,
)
from conductor_pipeline.training.synthetic import FAN_OUT_SHARE, MAX_FAN_OUT
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.workflow import DEFAULT_MAX_STEPS
from conductor_pipeline.world_model.prompts_and_pruning import PRUNE_HIGH, PRUNE_LOW
from resources.knobs import override_names, overrides_model

# The trainer profile a run uses unless its config says otherwise: `make train-paper` sets cpu-paper.
TRAINER_PROFILE_ENV = "CORYPHAEUS_TRAINER_PROFILE"


def default_trainer_profile() -> str:
    """`$CORYPHAEUS_TRAINER_PROFILE`, else the embedded default `cpu`; read when the resource is built."""
    return os.environ.get(TRAINER_PROFILE_ENV) or "cpu"


def _per_profile(attribute: str) -> str:
    """`cpu: names, cpu-paper: names, ...`: a profile default, for help text."""
    return ", ".join(f"{name}: {getattr(defaults, attribute)}" for name, defaults in PROFILES.items())


# Warm-start (SFT) settings over the profile's: SFTSettings' overridable knobs, each left empty
# keeps the profile's value.
SFTOverrides = overrides_model(
    "SFTOverrides", dg.Config, "Warm-start (SFT) settings over the profile's; each left empty keeps the profile's value.",
    __name__, (SFTSettings, ""),
)
# The TrainerResource fields that override GRPOSettings fields of the same name (None: the profile's),
# and those that override LoraSettings fields as lora_<name>: the knobs the library declares overridable.
GRPO_OVERRIDES = override_names(GRPOSettings)
LORA_OVERRIDES = override_names(LoraSettings)
_TrainerOverrides = overrides_model(
    "_TrainerOverrides", dg.ConfigurableResource, "The trainer resource's GRPO and LoRA overrides.",
    __name__, (GRPOSettings, ""), (LoraSettings, "lora_"),
)


class TrainerResource(_TrainerOverrides):
    """The conductor's training recipe as configuration: a profile plus overrides (`recipe()` builds
    the library's `Recipe` from them, checked once), and where its files go.

    Fields named like a `GRPOSettings` field (and those under `sft`, like `SFTSettings` fields)
    override the profile's value and carry the library's help text; left empty they keep the
    profile's (`conductor_pipeline.training.recipe.PROFILES`). The other fields are the pipeline's own.
    """

    profile: Profile = Field(
        default_factory=default_trainer_profile,
        description="cpu: tiny offline policy (CI, laptops; seconds per step); cpu-paper: the same policy at the "
        "paper's budget (groups of 64 x 4 questions x 200 steps); cpu-smollm2: SmolLM2-135M-Instruct, a real "
        f"pretrained model from the package index (minutes per step); gpu: Qwen2.5 + vLLM (default ${TRAINER_PROFILE_ENV}, "
        "else cpu)",
    )
    output_root: str = Field(
        default_factory=lambda: str(artifacts_root() / "training"),
        description="Root folder of models, probe runs, gate verdicts and checkpoints (default <artifacts root>/training)",
    )
    policy_model: str | None = Field(
        None,
        description=f"Hub id or local path; empty: the profile's ({_per_profile('policy')})",
    )
    device: str = Field(
        AUTO_DEVICE, pattern=DEVICE_PATTERN.pattern,
        description=f"{DEVICE_HELP}: the warm start, its parse checks, GRPO (TRL's use_cpu follows it), the "
        "pruning audit and the frozen policy that answers recursive conductor steps",
    )
    naming: Literal["auto", "ordinal", "names"] = Field(
        "auto",
        description=f"Workers shown as 'Model 0..k' (the paper's) or by name; auto: the profile's "
        f"({_per_profile('naming')}; by name the tiny CPU policy learns name tokens, which do not carry to other pools)",
    )
    prompt_examples: int | None = Field(
        None, ge=0,
        description=f"In-context example workflows; empty: the profile's ({_per_profile('prompt_examples')})",
    )
    show_predicted_success: bool | None = Field(
        None,
        description="Show the world model's P(success) next to each catalogue line of the training prompts (each "
        "question's numbers from a train-split W fitted without it: out of fold); the eval then shows the "
        f"trained policy its train-split W's numbers; empty: the profile's ({_per_profile('show_predicted_success')})",
    )
    ranked_catalogue: bool | None = Field(
        None,
        description="List each prompt's workers by those numbers, highest first, so a position means the same "
        f"thing in every pool (needs show_predicted_success); empty: the profile's ({_per_profile('ranked_catalogue')})",
    )
    probe_steps: int = Field(PROBE_STEPS, ge=1, description="Steps of the zero-variance probe run (enough groups to judge)")
    seed: int = Field(0, description="Seed of sampling, data order, pool randomisation and synthetic pairs")

    # GRPO overrides (GRPO_OVERRIDES) and lora_<name> (LORA_OVERRIDES) are inherited from
    # _TrainerOverrides, with the library's names, help text and bounds.

    # Recursion: a pool that seats the conductor.
    max_depth: int = Field(
        DEFAULT_MAX_DEPTH, ge=0,
        description="Recursion depth cap when the pool seats the conductor (a rollout's conductor steps are "
        "answered by a frozen copy of the policy GRPO started from)",
    )

    # The warm start.
    sft_warm_start: bool = Field(True, description="Supervised warm start on synthetic valid workflows before GRPO")
    sft_examples: int = Field(DEFAULT_SFT_EXAMPLES, ge=1, description="Synthetic warm-start pairs")
    synthetic_style: Literal["auto", "paper", "compact"] = Field(
        "auto",
        description=f"Warm-start targets; auto: the profile's ({_per_profile('synthetic_style')})",
    )
    fan_out_warm_start: bool = Field(
        False,
        description=f"On prompts that show a vote seat, make every multi-step warm-start target a fan-out "
        f"({MIN_VOTE_INPUTS} or more workers, drawn uniformly, then the vote over all of them); single-step "
        f"targets keep their share. Off: {FAN_OUT_SHARE:.0%} of such targets fan out and the rest are the "
        f"style's shapes, chains included. A shape prior, not routing: it says nothing about which workers",
    )
    max_fan_out: int | None = Field(
        None, ge=MIN_VOTE_INPUTS, le=DEFAULT_MAX_STEPS - 1,
        description=f"Most solvers a warm-start fan-out draws (uniformly from {MIN_VOTE_INPUTS} to this many); "
        f"empty: the style's ({', '.join(f'{style} {n}' for style, n in MAX_FAN_OUT.items())}; compact's three "
        f"and the vote fit the cpu profiles' 80-token cap, four need about 100 tokens: raise "
        f"max_completion_length with it)",
    )
    sft: SFTOverrides = Field(default_factory=SFTOverrides, description="Warm-start SFT settings over the profile's")
    parse_check_prompts: int = Field(
        PARSE_CHECK_PROMPTS, ge=1, description="Warm start: prompts sampled to measure the parse rate before and after"
    )
    parse_check_samples: int = Field(
        PARSE_CHECK_SAMPLES, ge=1, description="Warm start: samples per prompt (temperature 1) of the parse-rate check"
    )

    # What GRPO trains on, and the gate.
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
    prune_low: float = Field(PRUNE_LOW, ge=0, le=1, description="Pruning: 'none solves' when every P(success) is below")
    prune_high: float = Field(PRUNE_HIGH, ge=0, le=1, description="Pruning: 'all solve' when every P(success) is above")
    prune_audit_questions: int = Field(
        PRUNE_AUDIT_QUESTIONS, ge=0, description="Pruning: skipped questions the probe still samples to audit the skip"
    )
    time_limit_s: float | None = Field(
        None, gt=0, description="Stop GRPO early after this many seconds (it still writes a final checkpoint)"
    )
    zero_variance_threshold: float | None = Field(
        None, gt=0, le=1,
        description="The gate passes only if the flat-group fraction is strictly below; empty: the profile's "
        f"({_per_profile('zero_variance_threshold')})",
    )
    gate_on: GateOn = Field(
        GATE_ON_REWARD,
        description="What the gate counts as a flat group: 'reward' (equal rewards, the default rule) or "
        "'correctness' (every rollout equally correct, format ignored: no routing signal); both are reported",
    )

    # ------------------------------------------------------------------ the recipe

    def recipe(self) -> Recipe:
        """The profile's recipe with this resource's overrides: what the training assets train,
        checked once (a contradiction is refused, naming the settings)."""
        return Recipe.from_profile(
            self.profile, policy_model=self.policy_model, seed=self.seed, use_cpu=self.trains_on_cpu,
            grpo={name: getattr(self, name) for name in GRPO_OVERRIDES},
            lora={name: getattr(self, f"lora_{name}") for name in LORA_OVERRIDES},
            sft=self.sft.model_dump(),
            naming=None if self.naming == "auto" else self.naming, prompt_examples=self.prompt_examples,
            show_predicted_success=self.show_predicted_success, ranked_catalogue=self.ranked_catalogue,
            synthetic_style=None if self.synthetic_style == "auto" else self.synthetic_style,
            warm_start=WarmStartSettings(
                enabled=self.sft_warm_start, examples=self.sft_examples, fan_out=self.fan_out_warm_start,
                max_fan_out=self.max_fan_out, parse_check_prompts=self.parse_check_prompts,
                parse_check_samples=self.parse_check_samples,
            ),
            data=DataSettings(
                contested_subpools=self.contested_subpools, prune_with_world_model=self.prune_with_world_model,
                prune_low=self.prune_low, prune_high=self.prune_high, prune_audit_questions=self.prune_audit_questions,
            ),
            gate=GateSettings(
                probe_steps=self.probe_steps, zero_variance_threshold=self.zero_variance_threshold, gate_on=self.gate_on
            ),
            max_depth=self.max_depth, time_limit_s=self.time_limit_s,
        )

    def run_key(self, recipe: Recipe, settings: GRPOSettings, training: TrainingSet, start_policy: Path | str) -> str:
        """The key of a GRPO run of `settings` (the recipe's, or its probe's) on `training` from
        `start_policy`, with how the recipe's prompts show the pool (`grpo_run_key`)."""
        return grpo_run_key(
            settings, training, start_policy, naming=recipe.prompt.naming, n_examples=recipe.prompt.n_examples,
            contested_subpools=recipe.data.contested_subpools,
        )

    @property
    def resolved_device(self) -> str:
        """`device` with `auto` resolved (`resolve_device`): cuda when torch sees a GPU, else cpu."""
        return resolve_device(self.device)

    @property
    def trains_on_cpu(self) -> bool:
        """TRL's `use_cpu`: whether the device resolves to the CPU. Never on the gpu profile, which
        refuses a CPU device instead (`training_device`)."""
        return self.profile != "gpu" and self.resolved_device == "cpu"

    def training_device(self) -> str:
        """The resolved device, made the current GPU when it names one (`cuda:N`), for a step that
        trains or samples the policy; refused for the gpu profile without a GPU (its bf16 and vLLM
        settings cannot run on a CPU)."""
        device = self.resolved_device
        if self.profile == "gpu" and device == "cpu":
            raise ValueError(f"the gpu profile needs a GPU, but device {self.device!r} resolves to cpu on this machine")
        select_cuda_device(device)
        return device

    # ------------------------------------------------------------------ paths

    def pool_dir(self, pool_name: str) -> Path:
        """This seed's folder of the pool: each seed of a recipe keeps its own warm start, probe, gate
        and checkpoints, so seed runs resume, and alternating seeds retrains nothing."""
        return Path(self.output_root) / pool_name / f"seed-{self.seed}"

    def warm_start_dir(self, pool_name: str) -> Path:
        return self.pool_dir(pool_name) / "warm_start"

    def probe_dir(self, pool_name: str) -> Path:
        return self.pool_dir(pool_name) / "probe"

    def gate_path(self, pool_name: str) -> Path:
        return self.pool_dir(pool_name) / "gates" / "zero_variance_gate.json"

    def checkpoint_dir(self, pool_name: str) -> Path:
        return self.pool_dir(pool_name) / "grpo"

    def models_dir(self) -> Path:
        """Where base policies built or converted here are cached."""
        return Path(self.output_root) / "models"

    def base_policy_path(self) -> Path | str:
        """The policy before any training: the tiny model (built offline, cached), SmolLM2 (fetched
        from the package index and converted, cached) or a hub id / path."""
        model = self.policy_model or PROFILES[self.profile].policy
        if model == TINY_POLICY:
            return build_tiny_causal_lm(
                self.models_dir() / f"tiny-conductor-seed-{self.seed}",
                hidden_size=CPU_POLICY_HIDDEN_SIZE,
                num_layers=CPU_POLICY_LAYERS,
                seed=self.seed,
            )
        if model == SMOLLM2_POLICY:
            return smollm2_model(self.models_dir())
        return model

    def start_policy_path(self, pool_name: str) -> Path | str:
        """What GRPO starts from: the warm-started model when enabled, else the base policy."""
        return self.warm_start_dir(pool_name) if self.sft_warm_start else self.base_policy_path()

