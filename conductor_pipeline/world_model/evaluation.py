"""Does the world model earn its place? W against marginal baselines, and as a router.

Two splits, both out-of-sample for W and for every baseline (each is refitted per fold):

- `questions`: GroupKFold over question ids, so no question is on both sides; every row gets an
  out-of-fold prediction. Baselines: per-worker marginal accuracy, and per-worker x subject
  (x level) accuracy smoothed toward the worker marginal.
- `held_out_workers`: K folds over workers; W is trained WITHOUT the worker-identity feature and
  predicts unseen workers from catalogue attributes (the Conductor trains on randomised pools).
  A worker marginal does not exist for an unseen worker, so the baselines are the global rate,
  the family rate, and the question's rate among the training workers. Workers of one family go
  to different folds, so a family with several workers is always seen in training; a worker that
  is its family's only one (or has no catalogue family) gets the global rate as its family rate,
  and the report counts how many do.

Metrics (scikit-learn): log loss, Brier, ROC AUC, and expected calibration error, each with a
bootstrap interval that resamples *questions*; the paired difference W - baseline is bootstrapped
on the same resamples, and the verdict says whether its interval excludes 0. Routing value: on the
held-out questions of the `questions` split, the W-router (argmax predicted success, optionally
minus lambda x predicted cost) next to the best single worker and the oracle, with the share of
oracle headroom recovered, (W - best single) / (oracle - best single), like RouteLLM's APGR.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.world_model.cross_validation import (
    EvaluationSettings,
    catalogue_families,
    family_fallback_note,
    held_out_worker_folds,
    out_of_fold_predictions,
    question_folds,
)
from conductor_pipeline.world_model.data import normalize_training_frame
from conductor_pipeline.world_model.metrics import (
    METRICS,
    SplitReport,
    reliability_curve,
    score_predictions,
)
from conductor_pipeline.world_model.model import WorldModel
from conductor_pipeline.world_model.plots import reliability_png
from conductor_pipeline.world_model.routing import ROUTING_POPULATION_NOTE, RoutingReport, route_held_out

# Baselines that know the question's subject (and level): W must beat these to earn its features.
SUBJECT_AWARE_BASELINES = ("worker_x_subject", "worker_x_subject_x_level")


@dataclass
class WorldModelReport:
    splits: list[SplitReport]
    routing: list[RoutingReport]
    model_summary: dict[str, Any]
    reliability_png: bytes = b""
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def verdicts(self) -> list[str]:
        return [self.headline, *(s.verdict for s in self.splits), *(r.verdict for r in self.routing)]

    @property
    def beats_subject_aware(self) -> bool:
        """W's log loss beats every subject-aware baseline with an interval clear of 0."""
        questions = self.split("questions")
        present = [b for b in SUBJECT_AWARE_BASELINES if b in questions.scores]
        return bool(present) and all(questions.beats(b) for b in present)

    @property
    def headline(self) -> str:
        """One plain sentence: which baselines W clearly beats on held-out questions, and which not."""
        questions = self.split("questions")
        marginal = "beats" if questions.beats("worker_marginal") else "does NOT clearly beat"
        unclear = [b for b in SUBJECT_AWARE_BASELINES if b in questions.scores and not questions.beats(b)]
        worse = [b for b in unclear if questions.comparison(b).w_worse]
        if not unclear:
            return (f"W {marginal} the per-worker marginal and beats the subject-aware baselines "
                    f"({', '.join(SUBJECT_AWARE_BASELINES)}) on held-out questions (log loss, intervals clear of 0).")
        if worse:
            return (f"W {marginal} the per-worker marginal but LOSES TO {', '.join(worse)} on held-out questions "
                    "(log loss): a per-worker table of subject (and level) accuracy predicts better than W.")
        return (f"W {marginal} the per-worker marginal but does NOT clearly beat {', '.join(unclear)} on held-out "
                "questions (log loss interval includes 0): most of what W predicts, a per-worker table of subject "
                "(and level) accuracy predicts too.")

    def split(self, name: str) -> SplitReport:
        return next(s for s in self.splits if s.name == name)

    def metrics_table(self) -> pl.DataFrame:
        rows = [
            {"split": s.name, "model": model, "metric": metric, "value": e.value, "low": e.low, "high": e.high}
            for s in self.splits
            for model, metrics in s.scores.items()
            for metric, e in metrics.items()
        ]
        return pl.DataFrame(rows)

    def to_markdown(self, image_path: str | None = None) -> str:
        lines = ["# World model vs marginal baselines", "", "## Verdicts", ""]
        lines += [f"- {v}" for v in self.verdicts]
        for s in self.splits:
            lines += ["", f"## Split `{s.name}`", "", s.description, ""]
            lines.append(
                f"{s.n_rows} rows, {s.n_questions} questions, {s.n_workers} workers, {s.n_folds} folds; "
                f"{self.settings.get('confidence', 0.95):.0%} percentile-bootstrap intervals over questions "
                "(ECE is biased upward under resampling, so its interval can sit above the point estimate)."
            )
            lines += ["", "| model | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
            for model, metrics in s.scores.items():
                lines.append(f"| {model} | " + " | ".join(metrics[m].fmt() for m in METRICS) + " |")
            if s.note:
                lines += ["", s.note]
            lines += ["", "| W - baseline | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
            for baseline in dict.fromkeys(c.baseline for c in s.comparisons):
                cells = []
                for metric in METRICS:
                    c = next(c for c in s.comparisons if c.baseline == baseline and c.metric == metric)
                    mark = " (W better)" if c.w_better else (" (W worse)" if c.w_worse else "")
                    cells.append(c.difference.fmt() + mark)
                lines.append(f"| {baseline} | " + " | ".join(cells) + " |")
        if self.routing:
            lines += ["", "## Routing value (held-out questions)", ""]
            for r in self.routing:
                lines += [f"### Pool `{r.pool}`", "", f"Workers: {', '.join(r.workers)}", ""]
                lines += [ROUTING_POPULATION_NOTE.format(population=r.population), ""]
                lines += ["| arm | accuracy |", "|---|---|"]
                lines += [f"| {arm} | {e.fmt(3)} |" for arm, e in r.accuracy.items()]
                lines += ["", f"Share of oracle headroom recovered by the W-router: {r.headroom_recovered.fmt(3)}"]
                if r.note:
                    lines += ["", r.note]
                lines.append("")
        lines += ["", "## Model", "", *(f"- {k}: {v}" for k, v in self.model_summary.items())]
        if image_path:
            lines += ["", f"![reliability diagram]({image_path})"]
        return "\n".join(lines) + "\n"


def _split_report(
    name: str,
    description: str,
    frame: pl.DataFrame,
    predictions: dict[str, np.ndarray],
    n_folds: int,
    settings: EvaluationSettings,
) -> SplitReport:
    y = frame["correct"].cast(pl.Float64).to_numpy()
    qids = frame["question_id"].to_numpy()
    scores, comparisons = score_predictions(
        y, predictions, qids, n_bootstrap=settings.n_bootstrap, confidence=settings.confidence, seed=settings.seed
    )
    return SplitReport(
        name=name,
        description=description,
        n_rows=frame.height,
        n_questions=frame["question_id"].n_unique(),
        n_workers=frame["worker"].n_unique(),
        n_folds=n_folds,
        scores=scores,
        comparisons=comparisons,
        reliability={model: reliability_curve(y, p) for model, p in predictions.items()},
    )


def evaluate_world_model(
    frame: pl.DataFrame,
    seats: Mapping[str, WorkerSeat],
    settings: EvaluationSettings | None = None,
    *,
    full_model: WorldModel | None = None,
) -> WorldModelReport:
    """Every split, every baseline, the routing arms; `full_model` (fitted on all rows, else fitted
    here) only supplies the summary, never a prediction that is scored."""
    settings = settings or EvaluationSettings()
    frame = normalize_training_frame(frame).filter(pl.col("correct").is_not_null())
    predictions, cost = out_of_fold_predictions(
        frame, seats, settings, folds=question_folds(frame, settings.question_folds), held_out_workers=False
    )
    splits = [
        _split_report(
            "questions",
            "GroupKFold over questions: no question on both sides. Baselines are fitted per fold on the training questions.",
            frame,
            predictions,
            settings.question_folds,
            settings,
        )
    ]
    routing: list[RoutingReport] = []
    # An empty worker list asks for the automatic pool (workers that answered nearly every question).
    pools: dict[str, Sequence[str] | None] = {
        name: (workers or None) for name, workers in (settings.routing_pools or {"complete_workers": []}).items()
    }
    for pool_name, workers in pools.items():
        report = route_held_out(frame, predictions, cost, pool_name, workers, settings)
        if report is not None:
            routing.append(report)
    if settings.held_out_workers and frame["worker"].n_unique() >= 2 * min(settings.worker_folds, 3):
        families = catalogue_families(seats)
        worker_folds = held_out_worker_folds(frame, families, settings.worker_folds)
        held_predictions, _ = out_of_fold_predictions(frame, seats, settings, folds=worker_folds, held_out_workers=True)
        held_out = _split_report(
            "held_out_workers",
            "K folds over workers, the workers of one family spread over different folds: W never sees the test "
            "workers and has no worker-identity feature; it predicts them from catalogue attributes (family, size, "
            "prices) and the question. Baselines: global rate, family rate, and the question's rate among training "
            "workers.",
            frame,
            held_predictions,
            len(worker_folds),
            settings,
        )
        held_out.note = family_fallback_note(frame["worker"].unique().sort().to_list(), families)
        splits.append(held_out)
    full_model = full_model or WorldModel.fit(frame, seats, settings.model)
    return WorldModelReport(
        splits=splits,
        routing=routing,
        model_summary=full_model.summary() | {"top_features": list(full_model.feature_importance())[:8]},
        reliability_png=reliability_png(splits),
        settings=settings.model_dump(),
    )
