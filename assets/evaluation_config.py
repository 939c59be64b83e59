"""The run config of the evaluation assets, as the launchpad shows it: which questions and arms
`eval_arms` runs, and how `eval_tables` forms its paired intervals. Each knob is declared once here,
with its help text; the library reads them as its own typed objects (`SliceSpec`, `PairedSettings`).

(No `from __future__ import annotations`: Dagster reads config annotations as classes.)
"""

from collections.abc import Sequence

import dagster as dg
from pydantic import Field

from assets.world_model import WorldModelFitConfig
from conductor_pipeline.evaluation.comparisons import PairedSettings
from conductor_pipeline.evaluation.slices import DEFAULT_SLICE_SIZE, SliceSpec
from conductor_pipeline.stats import DEFAULT_BOOTSTRAP_RESAMPLES, DEFAULT_CONFIDENCE
from resources.conductor import ConductorPolicyResource


class EvalArmsConfig(dg.Config):
    """Which questions, how many, how often, and which conductors."""

    corpus: str = Field("math", description="Corpus of the eval slice (math or gsm8k)")
    splits: list[str] = Field(["test"], description="Source splits the slice draws from")
    math_levels: list[int] = Field([5], description="MATH levels (the replay pools record level 5)")
    slice_size: int = Field(DEFAULT_SLICE_SIZE, ge=1, description="Planned slice size: first N eval-split questions")
    order: str = Field(
        "question_id", description="Slice order: question_id (sorted; groups MATH subjects) or hashed (mixed)"
    )
    repeats: int = Field(
        1, ge=1,
        description="Repeats per arm (paper: up to 16); mean and SE (repeats replaying one recording are one sample)",
    )
    only_recorded: bool = Field(
        True, description="Replay pools: draw the slice from questions every replay seat has a recording for"
    )
    random_seed: int = Field(0, description="Seed of the uniformly random router")
    use_conductor_resource: bool = Field(True, description="Evaluate the `conductor` resource's policy")
    include_untrained: bool = Field(
        False,
        description="Also evaluate the `conductor` resource when it is the tiny random-weight default (no "
        "checkpoint, no endpoint): it only proves the path end to end and costs minutes of CPU",
    )
    conductor_checkpoints: list[str] = Field(
        [], description="Extra local HF checkpoints to evaluate as conductor arms"
    )
    checkpoint_temperature: float | None = Field(
        None, ge=0,
        description="Sample the checkpoint arms (configured and trained) at this temperature instead of the one "
        "they trained with (0: greedy); None keeps the trained one. It joins the eval run's id, not the arm names",
    )
    use_trained_checkpoint: bool = Field(
        True, description="Also evaluate the latest materialized conductor_checkpoint, when there is one"
    )
    use_warm_start_policy: bool = Field(
        True,
        description="Also evaluate the latest warm_start_policy model (warm-started, before GRPO), when one was "
        "trained: beside the trained checkpoint it shows what GRPO itself changed",
    )
    shuffled_catalogue: bool = Field(
        True,
        description="Also evaluate each conductor with the pool listed in another order for each question (seeded; "
        "an '@shuffled' arm beside the pool-file order): a conductor that routes by what the catalogue says "
        "scores the same and picks the same workers in both",
    )
    catalogue_seed: int = Field(0, description="Seed of the per-question catalogue orders of '@shuffled' arms")
    include_question: bool = Field(True, description="Show workers the original question next to their subtask")
    max_depth: int = Field(2, ge=0, description="Recursion depth cap when the pool seats the conductor")
    world_model_router: bool = Field(
        True, description="Run the W-router arm: per question, the worker a train-split world model rates highest"
    )
    w_router_lambda_cost: float = Field(
        0.0, ge=0, description="W-router score = P(success) - lambda x predicted cost (USD); 0 ranks on success alone"
    )
    w_cascade: bool = Field(
        True,
        description="Run the W-cascade arm: the cheapest worker (list price) the train-split W trusts enough",
    )
    w_cascade_threshold: float = Field(
        0.5, ge=0, le=1,
        description="W-cascade: predicted success a worker needs to answer; none reaches it -> best single",
    )
    vote_arms: bool = Field(
        True, description="Run broadcast-and-vote arms: every worker (and the best k) answers, the majority answer wins"
    )
    vote_top_k: list[int] = Field(
        [3, 5], description="Also vote over the best k workers of the train split, for each k (2 <= k < pool size)"
    )
    agreement_cascades: bool = Field(
        True,
        description="With the votes, run agreement cascades over the largest best-k vote (ask a few, add the rest "
        "when they disagree), chosen on the train split's probe answers",
    )
    world_model: WorldModelFitConfig = Field(
        default_factory=WorldModelFitConfig,
        description="Knobs of the train-split W that routes the W-router and fills '+W' conductor prompts",
    )

    def slice_spec(self) -> SliceSpec:
        """The slice settings as the library's one typed object."""
        return SliceSpec(
            corpus=self.corpus, splits=tuple(self.splits), math_levels=tuple(self.math_levels), size=self.slice_size,
            order=self.order, only_recorded=self.only_recorded,
        )

    def needs_world_model(self, conductors: Sequence[ConductorPolicyResource]) -> bool:
        """Whether any arm routes by, cascades on or prompts with the train-split W."""
        return self.world_model_router or self.w_cascade or any(c.show_predicted_success for c in conductors)


class EvalTablesConfig(dg.Config):
    """How the paired intervals are formed."""

    n_bootstrap: int = Field(
        DEFAULT_BOOTSTRAP_RESAMPLES, ge=100, description="Question resamples of every paired bootstrap interval"
    )
    confidence: float = Field(DEFAULT_CONFIDENCE, gt=0, lt=1, description="Coverage of every interval")
    seed: int = Field(0, description="Seed of the question resamples (one seed pairs every interval)")

    def paired_settings(self) -> PairedSettings:
        return PairedSettings(confidence=self.confidence, n_resamples=self.n_bootstrap, seed=self.seed)
