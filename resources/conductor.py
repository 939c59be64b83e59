"""The conductor-policy resource: which model writes workflows, and how it is prompted and sampled."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from conductor_pipeline.conductor.endpoint_policy import OpenAIEndpointPolicy
from conductor_pipeline.conductor.hf_policy import HFLocalPolicy, model_digest
from conductor_pipeline.conductor.prompt import DEFAULT_EXAMPLE_COUNT, PromptExample, PromptSpec, default_examples
from conductor_pipeline.conductor.protocols import ConductorPolicy
from conductor_pipeline.devices import AUTO_DEVICE, DEVICE_HELP, DEVICE_PATTERN
from conductor_pipeline.evaluation.arms import CatalogueOrder, ConductorArm
from conductor_pipeline.paths import artifacts_root
from conductor_pipeline.records import Question, stable_id
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm


def tiny_policy_dir() -> Path:
    """Where the tiny offline policy is built when no checkpoint is configured (the CPU profile's
    conductor; random weights, so the honest weak arm, not a result), under the artifacts root."""
    return artifacts_root() / "models" / "tiny-conductor"


# Random weights never write a workflow: longer samples from the tiny default only cost CPU time
# (about 400 questions x 1024 tokens would take hours on two shared cores), so it is capped here.
TINY_MAX_NEW_TOKENS = 128
# What a trained policy's prompt and sampling are made of (the training assets' `prompt` metadata).
# The resource's fields that say how the policy is prompted and sampled: a PromptSpec's, by name.
TRAINED_PROMPT_FIELDS = tuple(PromptSpec.model_fields)


class ConductorPolicyResource(dg.ConfigurableResource):
    """A conductor policy: a local Hugging Face causal LM or an OpenAI-compatible endpoint."""

    kind: Literal["hf_local", "openai_endpoint"] = Field(
        "hf_local", description="hf_local: transformers generate on this machine; openai_endpoint: any /v1 server"
    )
    model_path: str | None = Field(
        None,
        description="hf_local: a checkpoint folder (e.g. from training); empty builds the tiny offline model",
    )
    device: str = Field(AUTO_DEVICE, pattern=DEVICE_PATTERN.pattern, description=f"hf_local: {DEVICE_HELP}")
    base_url: str | None = Field(None, description="openai_endpoint: base URL ending in /v1")
    model: str | None = Field(None, description="openai_endpoint: served model id")
    api_key_env: str | None = Field(
        None, description="openai_endpoint: NAME of the environment variable holding the key (never the key)"
    )
    label: str | None = Field(None, description="Arm name in the eval tables; defaults to the policy's name")
    naming: Literal["ordinal", "names"] = Field(
        "ordinal", description="Workers shown as the paper's 'Model 0..k' or by their real names"
    )
    n_examples: int = Field(
        DEFAULT_EXAMPLE_COUNT, ge=0, description="In-context example workflows from other tasks (paper: 4, +7 points)"
    )
    temperature: float = Field(1.0, ge=0, description="Sampling temperature of the conductor (paper: 1.0)")
    max_new_tokens: int = Field(1024, gt=0, description="Budget for reasoning plus the workflow lists")
    show_predicted_success: bool = Field(
        False,
        description="Show the world model's P(success) per worker next to the catalogue (a W fitted on "
        "train-split questions only); the arm is then labelled '+W'",
    )
    ranked_catalogue: bool = Field(
        False,
        description="List the workers by the world model's P(success) on each question, highest first (needs "
        "show_predicted_success); the arm is then labelled '+W-ranked'",
    )
    constrained_decoding: bool = Field(
        False,
        description="hf_local: sample only workflows that parse against the workers each prompt shows "
        "(conductor_pipeline.conductor.constrained), as a policy trained with it was sampled",
    )
    fan_outs_only: bool = Field(
        False,
        description="hf_local, with constrained_decoding: every workflow of more than one step is a fan-out the "
        "pool's vote seat closes, as a policy trained with the trainer's fan_outs_only was sampled",
    )

    def build_policy(self, aggregators: Sequence[str] = ()) -> ConductorPolicy:
        """The policy object; a local model loads lazily on its first prompt. `aggregators`: the
        pool's vote seats, which constrained decoding lets only aggregate."""
        if self.kind == "openai_endpoint":
            if not self.base_url or not self.model:
                raise ValueError("an openai_endpoint conductor needs `base_url` and `model`")
            return OpenAIEndpointPolicy(self.base_url, self.model, self.api_key_env, name=self.label)
        path = Path(self.model_path) if self.model_path else build_tiny_causal_lm(tiny_policy_dir())
        return HFLocalPolicy(
            path, device=self.device, name=self.label or f"hf:{path.name}", constrained=self.constrained_decoding,
            aggregators=aggregators, fan_outs_only=self.fan_outs_only,
        )

    def fingerprint(self) -> str:
        """What decides the workflows this policy writes: its weights (a local model) or endpoint and
        model id, and how it is prompted and sampled. An eval run's id includes it, so a retrained
        checkpoint at the same path starts a new run instead of reusing the old one's workflows."""
        if self.kind == "openai_endpoint":
            model = f"{self.base_url}|{self.model}"
        else:
            model = model_digest(self.model_path or build_tiny_causal_lm(tiny_policy_dir()))
        # Constrained decoding and its fan-out rule join the id only when on: an arm without them is the
        # arm it was before.
        later = ["constrained"] if self.constrained_decoding else []
        later += ["fan-outs-only"] if self.constrained_decoding and self.fan_outs_only else []
        later += ["ranked"] if self.ranked_catalogue else []
        return stable_id(
            self.kind, model, self.naming, self.n_examples, self.effective_max_new_tokens, self.temperature,
            self.show_predicted_success, *later,
        )

    @property
    def untrained(self) -> bool:
        """Whether this is the tiny random-weight default (no checkpoint, no endpoint)."""
        return self.kind == "hf_local" and not self.model_path

    @property
    def effective_max_new_tokens(self) -> int:
        """`max_new_tokens`, capped for the tiny random-weight default (see TINY_MAX_NEW_TOKENS)."""
        if self.untrained:
            return min(self.max_new_tokens, TINY_MAX_NEW_TOKENS)
        return self.max_new_tokens

    def examples(self) -> list[PromptExample]:
        return default_examples(self.n_examples)

    @property
    def arm_label(self) -> str:
        """A stable arm name: the label, else what the policy is (tiny model, checkpoint or endpoint)."""
        if self.label:
            return self.label
        if self.kind == "openai_endpoint":
            base = f"openai:{self.model}"
        else:
            base = f"hf:{Path(self.model_path).name}" if self.model_path else "hf:tiny-conductor"
        # The same policy with and without W's numbers (or their order) in its prompt are different arms.
        if not self.show_predicted_success:
            return base
        return f"{base}+W-ranked" if self.ranked_catalogue else f"{base}+W"

    @property
    def prompt_spec(self) -> PromptSpec:
        """How this policy is prompted and sampled, as one typed value (its rules checked)."""
        return PromptSpec(**{field: getattr(self, field) for field in TRAINED_PROMPT_FIELDS})

    def with_checkpoint(self, path: str, trained_prompt: PromptSpec | None = None) -> ConductorPolicyResource:
        """A local checkpoint (its own default label) prompted and sampled like this policy, or, given
        the `trained_prompt` it was trained with (written beside its weights, `read_trained_prompt`,
        and published as `prompt` metadata), exactly as in training."""
        prompt = trained_prompt or self.prompt_spec
        return ConductorPolicyResource(kind="hf_local", model_path=path, device=self.device, **prompt.model_dump())

    def build_arm(
        self,
        predicted_success: Callable[[Question], Mapping[str, float]] | None = None,
        *,
        recursive: bool = False,
        catalogue_order: CatalogueOrder = "pool",
        catalogue_seed: int = 0,
        policy: ConductorPolicy | None = None,
    ) -> ConductorArm:
        """This policy as an eval arm named `conductor:<arm_label>` (`@shuffled` when it lists the
        pool in a per-question order, `+recursive` when the pool seats the conductor);
        `predicted_success` (W's numbers for the prompt) is used only when `show_predicted_success`
        is on. `policy`: an already built policy of this resource, shared by its arms."""
        return ConductorArm(
            self.arm_label, policy or self.build_policy(), naming=self.naming, examples=self.examples(),
            temperature=self.temperature, max_new_tokens=self.effective_max_new_tokens,
            predicted_success=predicted_success if self.show_predicted_success else None, recursive=recursive,
            catalogue_order=catalogue_order, catalogue_seed=catalogue_seed, ranked=self.prompt_spec.ranked_catalogue,
        )
