"""W on aggregator steps: does it predict a vote seat's success better than the vote's marginal
rate, by reading the step's topology (`visible_steps`) and the question?
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.world_model.cross_validation import (
    EvaluationSettings,
    out_of_fold_predictions,
    question_folds,
)
from conductor_pipeline.world_model.data import normalize_training_frame
from conductor_pipeline.world_model.metrics import W_NAME, Comparison, Estimate, score_predictions


@dataclass
class AggregatorStepReport:
    """W against the per-worker marginal on the steps of aggregator (vote) seats, out of sample.

    A vote's success depends on what it is shown, so W can only beat the vote's marginal rate by
    reading the step's topology (`visible_steps`) and the question; this says whether it does.
    """

    workers: list[str]
    n_rows: int
    n_questions: int
    scores: dict[str, dict[str, Estimate]]  # model -> metric -> estimate, on aggregator rows only
    comparisons: list[Comparison]
    by_visible_steps: pl.DataFrame  # visible_steps, rows, observed success, mean W and marginal predictions

    def beats_marginal(self, metric: str = "log_loss") -> bool:
        return next(c.w_better for c in self.comparisons if c.baseline == "worker_marginal" and c.metric == metric)

    @property
    def verdict(self) -> str:
        """One line: W's log loss on aggregator steps against the worker marginal's, and the paired interval."""
        w = self.scores[W_NAME]["log_loss"].value
        marginal = self.scores["worker_marginal"]["log_loss"].value
        comparison = next(c for c in self.comparisons if c.baseline == "worker_marginal" and c.metric == "log_loss")
        d = comparison.difference
        outcome = "BEATS" if comparison.w_better else ("LOSES TO" if comparison.w_worse else "does not clearly beat")
        return (
            f"aggregator steps ({', '.join(self.workers)}; {self.n_rows} rows, {self.n_questions} questions): "
            f"W {outcome} the worker marginal: log loss {w:.4f} vs {marginal:.4f}, "
            f"W - marginal {d.value:+.4f} [{d.low:+.4f}, {d.high:+.4f}]"
        )


def aggregator_workers(seats: Mapping[str, WorkerSeat]) -> list[str]:
    """The seats whose steps aggregate earlier results (vote seats)."""
    return [name for name, seat in seats.items() if seat.is_vote]


def score_aggregator_steps(
    frame: pl.DataFrame,
    predictions: Mapping[str, np.ndarray],
    seats: Mapping[str, WorkerSeat],
    settings: EvaluationSettings | None = None,
) -> AggregatorStepReport | None:
    """Score out-of-fold `predictions` (one array per model over `frame`'s rows, as the `questions`
    split computes them, `frame` being the normalized scored frame they were computed on) on the
    aggregator seats' rows; None when the frame has none."""
    settings = settings or EvaluationSettings()
    workers = aggregator_workers(seats)
    mask = frame["worker"].is_in(workers).to_numpy()
    if not mask.any():
        return None
    rows = frame.filter(pl.Series(mask))
    chosen = {name: np.asarray(values)[mask] for name, values in predictions.items()}
    y = rows["correct"].cast(pl.Float64).to_numpy()
    scores, comparisons = score_predictions(
        y, chosen, rows["question_id"].to_numpy(), n_bootstrap=settings.n_bootstrap,
        confidence=settings.confidence, seed=settings.seed,
    )
    by_visible_steps = (
        rows.select("visible_steps")
        .with_columns(y=pl.Series(y), w=pl.Series(chosen[W_NAME]), marginal=pl.Series(chosen["worker_marginal"]))
        .group_by("visible_steps")
        .agg(
            rows=pl.len(),
            observed=pl.col("y").mean(),
            w_mean=pl.col("w").mean(),
            marginal_mean=pl.col("marginal").mean(),
        )
        .sort("visible_steps")
    )
    return AggregatorStepReport(
        workers=sorted(set(rows["worker"].to_list())),
        n_rows=rows.height,
        n_questions=rows["question_id"].n_unique(),
        scores=scores,
        comparisons=comparisons,
        by_visible_steps=by_visible_steps,
    )


def evaluate_aggregator_steps(
    frame: pl.DataFrame, seats: Mapping[str, WorkerSeat], settings: EvaluationSettings | None = None
) -> AggregatorStepReport | None:
    """Does W predict aggregator steps better than their marginal? W and the baselines are fitted
    out of fold over questions on every row (probes and steps, as the `questions` split fits them)
    and scored on the vote seats' rows only. None when the frame has no aggregator rows."""
    settings = settings or EvaluationSettings()
    frame = normalize_training_frame(frame).filter(pl.col("correct").is_not_null())
    if not frame["worker"].is_in(aggregator_workers(seats)).any():
        return None
    predictions, _ = out_of_fold_predictions(
        frame, seats, settings, folds=question_folds(frame, settings.question_folds), held_out_workers=False
    )
    return score_aggregator_steps(frame, predictions, seats, settings)
