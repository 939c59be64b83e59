"""A training recipe: everything that decides what a conductor run learns, as one typed value.

A recipe is a trainer profile (cpu | cpu-paper | cpu-smollm2 | gpu: the policy, GRPO's and the warm
start's settings at that scale, how workers are shown) plus the overrides a run asks for. It is
built once (`Recipe.from_profile`), checks the rules that tie its parts together once, when it is
built, and travels whole: the trainer resource builds it from its fields, the training assets read
their settings from it, and its `prompt` is written beside the weights for the eval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any, Literal

from pydantic import ValidationError

from conductor_pipeline.conductor.prompt import Naming, PromptSpec
from conductor_pipeline.conductor.recursion import DEFAULT_MAX_DEPTH
from conductor_pipeline.training.gates import GATE_ON_REWARD, ZERO_VARIANCE_THRESHOLD, GateOn
from conductor_pipeline.training.settings import (
    PAPER_POLICY,
    SMOLLM2_POLICY,
    TINY_POLICY,
    GRPOSettings,
    LoraSettings,
    SFTSettings,
    gpu_lora,
)
from conductor_pipeline.training.synthetic import SyntheticStyle
from conductor_pipeline.world_model.prompts_and_pruning import PRUNE_HIGH, PRUNE_LOW

Profile = Literal["cpu", "cpu-paper", "cpu-smollm2", "gpu"]
# Synthetic warm-start pairs: the CPU profile's 160 steps x 8 see each about 5 times, which teaches
# the format better than more pairs seen once.
DEFAULT_SFT_EXAMPLES = 256
# Parse rate before/after the warm start: this many prompts x samples at temperature 1. 256 samples
# tell 6% from 90% at a glance, and are enough to see a preference for catalogue positions (the
# choice balance); a second or two on the tiny model, minutes on SmolLM2.
PARSE_CHECK_PROMPTS = 32
PARSE_CHECK_SAMPLES = 8
# Skipped questions the probe samples anyway (no gradient) to audit the pruning decision.
PRUNE_AUDIT_QUESTIONS = 8
# Steps of the zero-variance probe run: enough groups to judge.
PROBE_STEPS = 20


@dataclass(frozen=True)
class ProfileDefaults:
    """What a profile chooses: its policy, GRPO and SFT settings at its scale, how its prompts show
    the workers, how many in-context examples they carry, and the warm start's target style."""

    policy: str
    grpo: Callable[..., GRPOSettings]
    sft: Callable[..., SFTSettings]
    naming: Naming
    prompt_examples: int
    synthetic_style: SyntheticStyle
    show_predicted_success: bool = False
    ranked_catalogue: bool = False
    zero_variance_threshold: float = ZERO_VARIANCE_THRESHOLD


# In-context examples: the paper's 4 on GPU; none on CPU, where prompt length is the main cost of a
# step (4 examples double SmolLM2's ~650-token prompt) and the warm start teaches the format instead.
# Naming: pretrained models as the paper's ordinal "Model 0..k". The default `cpu` profile is the
# conductor for any pool: ordinal names over a catalogue ranked by W's P(success) on the question
# (shown on each line), sampled under constrained decoding, so "Model 0" means "the worker W rates
# highest here" in every pool and only listed workers can be written. By name, the tiny policy learnt
# a preference for name tokens and wrote them on pools without those workers (docs/LOG.md).
# cpu-paper keeps names (its recorded fan-out recipe was trained that way). Warm-start targets: the
# compact lists-only style for the tiny random-weight model, the paper's shapes with a reasoning line
# for instruct models (conductor_pipeline.training.synthetic).
# Ranked groups are flat more often (a policy that follows the ranking agrees with itself when W's
# top worker is right), so its gate admits up to RANKED_ZERO_VARIANCE_THRESHOLD of flat groups.
RANKED_ZERO_VARIANCE_THRESHOLD = 0.35
PROFILES: dict[str, ProfileDefaults] = {
    "cpu": ProfileDefaults(
        TINY_POLICY, partial(GRPOSettings.cpu_profile, constrained_decoding=True), SFTSettings.cpu_profile,
        "ordinal", 0, "compact", show_predicted_success=True, ranked_catalogue=True,
        zero_variance_threshold=RANKED_ZERO_VARIANCE_THRESHOLD,
    ),
    "cpu-paper": ProfileDefaults(
        TINY_POLICY, GRPOSettings.cpu_paper_profile, SFTSettings.cpu_profile, "names", 0, "compact"
    ),
    "cpu-smollm2": ProfileDefaults(
        SMOLLM2_POLICY, GRPOSettings.cpu_smollm2_profile, SFTSettings.cpu_smollm2_profile, "ordinal", 0, "paper"
    ),
    "gpu": ProfileDefaults(PAPER_POLICY, GRPOSettings.gpu_profile, SFTSettings.gpu_profile, "ordinal", 4, "paper"),
}


def _or(override: bool | None, default: bool) -> bool:
    return default if override is None else override


def _with_threshold(gate: GateSettings, profile_threshold: float) -> GateSettings:
    return gate if gate.zero_variance_threshold is not None else replace(gate, zero_variance_threshold=profile_threshold)


class RecipeError(ValueError):
    """A recipe whose parts contradict each other; the message says which settings and what to set."""


@dataclass(frozen=True)
class WarmStartSettings:
    """The supervised warm start on synthetic valid workflows, and its parse-rate check."""

    enabled: bool = True
    examples: int = DEFAULT_SFT_EXAMPLES
    style: SyntheticStyle = "compact"
    fan_out: bool = False
    max_fan_out: int | None = None
    parse_check_prompts: int = PARSE_CHECK_PROMPTS
    parse_check_samples: int = PARSE_CHECK_SAMPLES


@dataclass(frozen=True)
class DataSettings:
    """What GRPO trains on: the contested set, its sub-pools, and pruning by the world model."""

    contested_subpools: bool = True
    prune_with_world_model: bool = False
    prune_low: float = PRUNE_LOW
    prune_high: float = PRUNE_HIGH
    prune_audit_questions: int = PRUNE_AUDIT_QUESTIONS


@dataclass(frozen=True)
class GateSettings:
    """The zero-variance probe and the rule that opens the gate to training."""

    probe_steps: int = PROBE_STEPS
    zero_variance_threshold: float | None = None  # None: the profile's (`ProfileDefaults`)
    gate_on: GateOn = GATE_ON_REWARD


@dataclass(frozen=True)
class Recipe:
    """One conductor training recipe, whole: checked once, when it is built."""

    profile: str
    grpo: GRPOSettings
    sft: SFTSettings
    prompt: PromptSpec
    warm_start: WarmStartSettings = field(default_factory=WarmStartSettings)
    data: DataSettings = field(default_factory=DataSettings)
    gate: GateSettings = field(default_factory=GateSettings)
    max_depth: int = DEFAULT_MAX_DEPTH
    time_limit_s: float | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise RecipeError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every rule between the recipe's parts it breaks, each with what to set."""
        grpo, problems = self.grpo, []  # GRPO's own rules hold already (GRPOSettings.__post_init__)
        if self.gate.zero_variance_threshold is None:
            problems.append("the gate has no zero_variance_threshold: build recipes with Recipe.from_profile")
        if grpo.constrained_decoding and self.warm_start.style != "compact":
            problems.append(f"constrained_decoding samples the three lists alone, but the warm start's style is "
                            f"{self.warm_start.style!r}, which writes text before them: set synthetic_style: compact")
        sampled = {"max_new_tokens": grpo.max_completion_length, "temperature": grpo.temperature,
                   "constrained_decoding": grpo.constrained_decoding, "fan_outs_only": grpo.fan_outs_only}
        differs = [name for name, value in sampled.items() if getattr(self.prompt, name) != value]
        if differs:
            problems.append(f"the prompt's {', '.join(differs)} must be GRPO's: the eval samples as training did")
        return problems

    @property
    def seed(self) -> int:
        return self.grpo.seed

    def probe(self) -> GRPOSettings:
        """GRPO's settings for the zero-variance probe: the recipe's, for `gate.probe_steps` steps."""
        return replace(self.grpo, max_steps=self.gate.probe_steps)

    def describe(self) -> dict[str, Any]:
        """Every setting, nested by part, for metadata."""
        return {"profile": self.profile, "grpo": self.grpo.describe(), "sft": asdict(self.sft),
                "prompt": self.prompt.model_dump(), "warm_start": asdict(self.warm_start), "data": asdict(self.data),
                "gate": asdict(self.gate), "max_depth": self.max_depth, "time_limit_s": self.time_limit_s}

    @classmethod
    def from_profile(
        cls,
        profile: str,
        *,
        policy_model: str | None = None,
        seed: int = 0,
        use_cpu: bool = True,
        grpo: Mapping[str, Any] | None = None,
        lora: Mapping[str, Any] | None = None,
        sft: Mapping[str, Any] | None = None,
        naming: Naming | None = None,
        prompt_examples: int | None = None,
        show_predicted_success: bool | None = None,
        ranked_catalogue: bool | None = None,
        synthetic_style: SyntheticStyle | None = None,
        warm_start: WarmStartSettings | None = None,  # its style is `synthetic_style` (None: the profile's)
        data: DataSettings | None = None,
        gate: GateSettings | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
        time_limit_s: float | None = None,
    ) -> Recipe:
        """`profile`'s recipe with these overrides (None keeps the profile's value): GRPO's and the
        warm start's knobs by the library's names, LoRA's by `LoraSettings`' names."""
        if profile not in PROFILES:
            raise RecipeError(f"unknown trainer profile {profile!r}; known: {', '.join(PROFILES)}")
        defaults = PROFILES[profile]
        model = policy_model or defaults.policy
        base_lora = gpu_lora(model) if profile == "gpu" else LoraSettings()
        adapters = replace(base_lora, **{k: v for k, v in (lora or {}).items() if v is not None})
        overrides: dict[str, Any] = {"seed": seed, "use_cpu": use_cpu and profile != "gpu", "lora": adapters,
                                     **{k: v for k, v in (grpo or {}).items() if v is not None}}
        if profile == "gpu":
            vllm_mode = overrides.pop("vllm_mode", None) or "colocate"
            grpo_settings = replace(GRPOSettings.gpu_profile(model, vllm_mode=vllm_mode), **overrides)
        else:
            grpo_settings = defaults.grpo(policy_model=model, **overrides)
        # One optimizer step per generation batch needs batch | rollouts; shrink the micro-batch if not.
        if grpo_settings.rollouts_per_step % (grpo_settings.per_device_train_batch_size * grpo_settings.num_processes):
            grpo_settings = replace(
                grpo_settings, per_device_train_batch_size=grpo_settings.rollouts_per_step // grpo_settings.num_processes
            )
        sft_base = defaults.sft(model) if profile == "gpu" else defaults.sft()
        sft_settings = replace(sft_base, seed=seed, use_cpu=use_cpu and profile != "gpu", lora=adapters,
                               **{k: v for k, v in (sft or {}).items() if v is not None})
        style = synthetic_style or defaults.synthetic_style
        try:
            prompt = PromptSpec(
                naming=naming or defaults.naming,
                n_examples=defaults.prompt_examples if prompt_examples is None else prompt_examples,
                max_new_tokens=grpo_settings.max_completion_length, temperature=grpo_settings.temperature,
                show_predicted_success=_or(show_predicted_success, defaults.show_predicted_success),
                ranked_catalogue=_or(ranked_catalogue, defaults.ranked_catalogue),
                constrained_decoding=grpo_settings.constrained_decoding, fan_outs_only=grpo_settings.fan_outs_only,
            )
        except ValidationError as exc:
            raise RecipeError("; ".join(error["msg"] for error in exc.errors())) from exc
        return cls(
            profile=profile, grpo=grpo_settings, sft=sft_settings, prompt=prompt,
            warm_start=replace(warm_start or WarmStartSettings(), style=style), data=data or DataSettings(),
            gate=_with_threshold(gate or GateSettings(), defaults.zero_variance_threshold),
            max_depth=max_depth, time_limit_s=time_limit_s,
        )
