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
from dataclasses import replace
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from conductor_pipeline.conductor.prompt import Naming
from conductor_pipeline.conductor.recursion import DEFAULT_MAX_DEPTH
from conductor_pipeline.devices import AUTO_DEVICE, DEVICE_HELP, DEVICE_PATTERN, resolve_device, select_cuda_device
from conductor_pipeline.paths import artifacts_root
from conductor_pipeline.training.dataset import TrainingSet
from conductor_pipeline.training.gates import GATE_ON_REWARD, ZERO_VARIANCE_THRESHOLD, GateOn
from conductor_pipeline.training.pretrained import smollm2_model
from conductor_pipeline.training.runs import grpo_run_key
from conductor_pipeline.training.settings import (
    CPU_POLICY_HIDDEN_SIZE,
    CPU_POLICY_LAYERS,
    PAPER_POLICY,
    SMOLLM2_POLICY,
    TINY_POLICY,
    GRPOSettings,
    LoraSettings,
    SFTSettings,
    gpu_lora,
)
from conductor_pipeline.training.synthetic import FAN_OUT_SHARE, MAX_FAN_OUT, SyntheticStyle
from conductor_pipeline.pools.backends.vote import MIN_VOTE_INPUTS
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.workflow import DEFAULT_MAX_STEPS
from conductor_pipeline.world_model.prompts_and_pruning import PRUNE_HIGH, PRUNE_LOW
from resources.knobs import override_names, overrides_model

# Synthetic warm-start pairs: the CPU profile's 160 steps x 8 see each about 5 times, which teaches
# the format better than more pairs seen once.
DEFAULT_SFT_EXAMPLES = 256
# In-context examples in the conductor prompt: the paper's 4 on GPU; none on CPU, where prompt
# length is the main cost of a step (4 examples double SmolLM2's ~650-token prompt) and the warm
# start teaches the format instead.
CPU_PROMPT_EXAMPLES = 0
GPU_PROMPT_EXAMPLES = 4
# Warm-start targets: the paper's shapes with a reasoning line for instruct models (SmolLM2 and
# the GPU profile's Qwen2.5); the compact lists-only style for the tiny random-weight model (why:
# conductor_pipeline.training.synthetic).
CPU_SYNTHETIC_STYLE: SyntheticStyle = "compact"
GPU_SYNTHETIC_STYLE: SyntheticStyle = "paper"
Profile = Literal["cpu", "cpu-paper", "cpu-smollm2", "gpu"]
# Per profile: its default policy, GRPO and SFT settings, prompt examples and warm-start style.
PROFILE_POLICY: dict[str, str] = {
    "cpu": TINY_POLICY, "cpu-paper": TINY_POLICY, "cpu-smollm2": SMOLLM2_POLICY, "gpu": PAPER_POLICY,
}
PROFILE_PROMPT_EXAMPLES: dict[str, int] = {
    "cpu": CPU_PROMPT_EXAMPLES, "cpu-paper": CPU_PROMPT_EXAMPLES, "cpu-smollm2": CPU_PROMPT_EXAMPLES,
    "gpu": GPU_PROMPT_EXAMPLES,
}
PROFILE_SYNTHETIC_STYLE: dict[str, SyntheticStyle] = {
    "cpu": CPU_SYNTHETIC_STYLE, "cpu-paper": CPU_SYNTHETIC_STYLE, "cpu-smollm2": GPU_SYNTHETIC_STYLE,
    "gpu": GPU_SYNTHETIC_STYLE,
}
# How each profile shows the workers: the tiny CPU policy by name (it learns which names to prefer,
# but never learnt which catalogue line an ordinal number stands for: the learnability ladder's R2
# against R3), pretrained models as the paper's ordinal "Model 0..k".
PROFILE_NAMING: dict[str, Naming] = {"cpu": "names", "cpu-paper": "names", "cpu-smollm2": "ordinal", "gpu": "ordinal"}
# The trainer profile a run uses unless its config says otherwise: `make train-paper` sets cpu-paper.
TRAINER_PROFILE_ENV = "CORYPHAEUS_TRAINER_PROFILE"


def default_trainer_profile() -> str:
    """`$CORYPHAEUS_TRAINER_PROFILE`, else the embedded default `cpu`; read when the resource is built."""
    return os.environ.get(TRAINER_PROFILE_ENV) or "cpu"
# Skipped questions the probe samples anyway (no gradient) to audit the pruning decision.
PRUNE_AUDIT_QUESTIONS = 8
# Parse rate before/after the warm start: this many prompts x samples at temperature 1. 256 samples
# tell 6% from 90% at a glance, and are enough to see a preference for catalogue positions (the
# choice balance); a second or two on the tiny model, minutes on SmolLM2.
PARSE_CHECK_PROMPTS = 32
PARSE_CHECK_SAMPLES = 8


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
    """GRPO/SFT configuration of the conductor: a profile (cpu | gpu) plus overrides.

    Fields named like a `GRPOSettings` field (and those under `sft`, like `SFTSettings` fields)
    override the profile's value and carry the library's help text; left empty they keep the
    profile's (`GRPOSettings.cpu_profile` / `gpu_profile`). The other fields are the pipeline's own.
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
        description=f"Hub id or local path; empty: '{TINY_POLICY}' on cpu, '{SMOLLM2_POLICY}' on cpu-smollm2, "
        f"{PAPER_POLICY} on gpu",
    )
    device: str = Field(
        AUTO_DEVICE, pattern=DEVICE_PATTERN.pattern,
        description=f"{DEVICE_HELP}: the warm start, its parse checks, GRPO (TRL's use_cpu follows it), the "
        "pruning audit and the frozen policy that answers recursive conductor steps",
    )
    naming: Literal["auto", "ordinal", "names"] = Field(
        "auto",
        description="Workers shown as 'Model 0..k' (the paper's) or by name; auto: the profile's ("
        + ", ".join(f"{profile}: {naming}" for profile, naming in PROFILE_NAMING.items())
        + "; the tiny CPU policy cannot learn which catalogue line a number stands for, see "
        "benchmarks/RESULTS-learnability.md)",
    )
    prompt_examples: int | None = Field(
        None, ge=0,
        description=f"In-context example workflows; empty: {CPU_PROMPT_EXAMPLES} on cpu and cpu-smollm2, "
        f"{GPU_PROMPT_EXAMPLES} on gpu",
    )
    show_predicted_success: bool = Field(
        False,
        description="Show the world model's P(success) next to each catalogue line of the training prompts (each "
        "question's numbers from a train-split W fitted without it: out of fold); the eval then shows the "
        "trained policy its train-split W's numbers",
    )
    probe_steps: int = Field(20, ge=1, description="Steps of the zero-variance probe run (20: enough groups to judge)")
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
        description=f"Warm-start targets; auto: '{CPU_SYNTHETIC_STYLE}' on cpu, '{GPU_SYNTHETIC_STYLE}' on "
        "cpu-smollm2 and gpu",
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
    zero_variance_threshold: float = Field(
        ZERO_VARIANCE_THRESHOLD, gt=0, le=1, description="The gate passes only if the flat-group fraction is strictly below"
    )
    gate_on: GateOn = Field(
        GATE_ON_REWARD,
        description="What the gate counts as a flat group: 'reward' (equal rewards, the default rule) or "
        "'correctness' (every rollout equally correct, format ignored: no routing signal); both are reported",
    )

    # ------------------------------------------------------------------ settings

    def grpo_settings(self, *, steps: int | None = None) -> GRPOSettings:
        """The profile's GRPOSettings with this resource's overrides (`steps` overrides max_steps)."""
        overrides: dict[str, object] = {"seed": self.seed, "use_cpu": self.trains_on_cpu}
        overrides.update((name, getattr(self, name)) for name in GRPO_OVERRIDES if getattr(self, name) is not None)
        if steps is not None:
            overrides["max_steps"] = steps
        overrides["lora"] = self.lora_settings()
        if self.profile == "gpu":
            settings = replace(
                GRPOSettings.gpu_profile(self.policy_model or PAPER_POLICY, vllm_mode=self.vllm_mode), **overrides
            )
        else:
            if self.policy_model:
                overrides["policy_model"] = self.policy_model
            profile = {
                "cpu-smollm2": GRPOSettings.cpu_smollm2_profile, "cpu-paper": GRPOSettings.cpu_paper_profile,
            }.get(self.profile, GRPOSettings.cpu_profile)
            settings = profile(**overrides)
        # One optimizer step per generation batch needs batch | rollouts; shrink the micro-batch if not.
        if settings.rollouts_per_step % (settings.per_device_train_batch_size * settings.num_processes):
            settings = replace(settings, per_device_train_batch_size=settings.rollouts_per_step // settings.num_processes)
        if settings.fan_outs_only and not settings.constrained_decoding:
            raise ValueError("fan_outs_only is a rule of constrained decoding: set constrained_decoding: true too")
        if settings.constrained_decoding and self.warm_start_style != "compact":
            raise ValueError(
                f"constrained_decoding samples the three lists alone, but the warm start's style is "
                f"{self.warm_start_style!r}, which writes text before them: set synthetic_style: compact"
            )
        return settings

    def sft_settings(self) -> SFTSettings:
        """The profile's SFTSettings with the `sft` overrides."""
        if self.profile == "gpu":
            base = SFTSettings.gpu_profile(self.policy_model or PAPER_POLICY)
        else:
            base = SFTSettings.cpu_smollm2_profile() if self.profile == "cpu-smollm2" else SFTSettings.cpu_profile()
        overrides: dict[str, object] = {name: value for name, value in self.sft.model_dump().items() if value is not None}
        return replace(
            base, seed=self.seed, use_cpu=self.trains_on_cpu, lora=self.lora_settings(), **overrides
        )

    def lora_settings(self) -> LoraSettings:
        """The adapters of the warm start and of GRPO: the profile's (`gpu_lora` on gpu: adapters for
        7B-class policies; none on the cpu profiles) with the `lora_*` fields set here (rank 0: full
        fine-tuning)."""
        base = gpu_lora(self.policy_model or PAPER_POLICY) if self.profile == "gpu" else LoraSettings()
        chosen = {name: getattr(self, f"lora_{name}") for name in LORA_OVERRIDES}
        return replace(base, **{name: value for name, value in chosen.items() if value is not None})

    def trained_prompt(self, settings: GRPOSettings) -> dict[str, object]:
        """How the policy is prompted and sampled in training: evaluation prompts it the same way."""
        return {
            "naming": self.worker_naming, "n_examples": self.n_prompt_examples,
            "max_new_tokens": settings.max_completion_length, "temperature": settings.temperature,
            "show_predicted_success": self.show_predicted_success,
            "constrained_decoding": settings.constrained_decoding, "fan_outs_only": settings.fan_outs_only,
        }

    def run_key(self, settings: GRPOSettings, training: TrainingSet, start_policy: Path | str) -> str:
        """The key of a GRPO run of `settings` on `training` from `start_policy`, with how this
        resource's prompts show the pool (`grpo_run_key`)."""
        return grpo_run_key(
            settings, training, start_policy, naming=self.worker_naming, n_examples=self.n_prompt_examples,
            contested_subpools=self.contested_subpools,
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

    @property
    def warm_start_style(self) -> SyntheticStyle:
        if self.synthetic_style != "auto":
            return self.synthetic_style
        return PROFILE_SYNTHETIC_STYLE[self.profile]

    @property
    def worker_naming(self) -> Naming:
        """`naming` with `auto` resolved to the profile's (PROFILE_NAMING)."""
        return PROFILE_NAMING[self.profile] if self.naming == "auto" else self.naming

    @property
    def n_prompt_examples(self) -> int:
        if self.prompt_examples is not None:
            return self.prompt_examples
        return PROFILE_PROMPT_EXAMPLES[self.profile]

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
        model = self.grpo_settings().policy_model
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

    def describe(self) -> dict[str, object]:
        """Knobs for metadata (no secrets exist here; endpoints are local URLs)."""
        return {"profile": self.profile, **self.grpo_settings().describe()}
