"""W as a router, on the held-out questions of the `questions` split: the W-router (argmax
predicted success, optionally minus lambda x predicted cost) next to the best single worker and the
oracle, with the share of oracle headroom recovered, (W - best single) / (oracle - best single),
like RouteLLM's APGR.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from conductor_pipeline.corpora.summaries import population_text
from conductor_pipeline.splits import split_of
from conductor_pipeline.world_model.cross_validation import EvaluationSettings
from conductor_pipeline.world_model.metrics import W_NAME, Estimate

ROUTING_POPULATION_NOTE = (
    "Routed questions: {population}. These are every question on which each worker of the pool has a scored "
    "call (probe or workflow step) in the warehouse, on both sides of the project's train/eval split, each routed "
    "by a W fitted without it (GroupKFold over questions). It is not the eval slice `eval_tables` routes on, and "
    "`oracle_ceilings` counts probe calls of this pool only, so their accuracies differ in scale."
)


@dataclass
class RoutingReport:
    pool: str
    workers: list[str]
    n_questions: int
    accuracy: dict[str, Estimate]  # arm -> accuracy on the held-out questions
    best_single_worker: str
    headroom_recovered: Estimate  # (W - best single) / (oracle - best single)
    lambda_cost: float
    note: str = ""
    population: str = ""  # the routed questions by corpus and level, and by side of the project's split

    def figures(self) -> dict[str, Any]:
        """The routing numbers as plain values, for asset metadata that other assets read (no
        parsing of the verdict text)."""
        recovered = self.headroom_recovered
        return {
            "questions": self.n_questions,
            "population": self.population,
            "best_single_worker": self.best_single_worker,
            **{arm: self.accuracy[arm].value for arm in ("best_single", "oracle", "w_router")},
            "headroom_recovered": [recovered.value, recovered.low, recovered.high],
        }

    @property
    def verdict(self) -> str:
        w = self.accuracy["w_router"]
        best = self.accuracy["best_single"]
        oracle = self.accuracy["oracle"]
        population = self.population or f"{self.n_questions} questions"
        return (
            f"routing on {self.pool} ({len(self.workers)} workers; {population}; each routed out-of-fold): "
            f"W-router {w.value:.3f} vs best single {best.value:.3f} ({self.best_single_worker}) vs oracle {oracle.value:.3f}; "
            f"headroom recovered {self.headroom_recovered.value:+.1%} [{self.headroom_recovered.low:+.1%}, {self.headroom_recovered.high:+.1%}]"
        )


def route_held_out(
    frame: pl.DataFrame,
    predictions: Mapping[str, np.ndarray],
    cost: np.ndarray,
    pool_name: str,
    workers: Sequence[str] | None,
    settings: EvaluationSettings,
) -> RoutingReport | None:
    """Routers from out-of-fold predictions on questions every pool worker answered."""
    cells = (
        frame.with_columns(
            y=pl.col("correct").cast(pl.Float64),
            **{f"pred_{name}": pl.Series(values) for name, values in predictions.items()},
            pred_cost=pl.Series(np.nan_to_num(cost, nan=0.0)),
        )
        .group_by("question_id", "worker")
        .agg(pl.col("y").mean(), *(pl.col(f"pred_{n}").mean() for n in predictions), pl.col("pred_cost").mean())
    )
    n_all = cells["question_id"].n_unique()
    if workers is None:
        coverage = cells.group_by("worker").agg(share=pl.len() / n_all)
        workers = sorted(coverage.filter(pl.col("share") >= settings.routing_min_coverage)["worker"].to_list())
    workers = list(workers)
    if len(workers) < 2:
        return None
    cells = cells.filter(pl.col("worker").is_in(workers))
    complete = cells.group_by("question_id").agg(pl.len().alias("n")).filter(pl.col("n") == len(workers))["question_id"]
    cells = cells.filter(pl.col("question_id").is_in(complete.implode())).sort("question_id", "worker")
    n_questions = complete.len()
    if n_questions == 0:
        return None
    sides = [split_of(question_id) for question_id in complete.to_list()]
    routed = frame.filter(pl.col("question_id").is_in(complete.implode())).select("question_id", "corpus", "level")
    population = (
        f"{population_text(routed)}; {sides.count('train')} on the train side of the project's split, "
        f"{sides.count('eval')} on the eval side"
    )
    order = {w: i for i, w in enumerate(sorted(workers))}
    y = cells["y"].to_numpy().reshape(n_questions, len(order))

    def routed(score_column: str, *, with_cost: bool = False) -> np.ndarray:
        score = cells[score_column].to_numpy().reshape(n_questions, len(order))
        if with_cost and settings.lambda_cost > 0:
            score = score - settings.lambda_cost * cells["pred_cost"].to_numpy().reshape(n_questions, len(order))
        return y[np.arange(n_questions), score.argmax(axis=1)]

    per_question = {
        "w_router": routed(f"pred_{W_NAME}", with_cost=True),
        **{f"{name}_router": routed(f"pred_{name}") for name in predictions if name != W_NAME},
        "oracle": y.max(axis=1),
    }
    means = y.mean(axis=0)
    best_index = int(means.argmax())
    best_worker = sorted(order)[best_index]
    per_question["best_single"] = y[:, best_index]
    per_question["mean_worker"] = y.mean(axis=1)

    rng = np.random.default_rng(settings.seed)
    draws = [rng.integers(0, n_questions, n_questions) for _ in range(settings.n_bootstrap)]
    tail = (1 - settings.confidence) / 2

    def estimate(values: np.ndarray) -> Estimate:
        samples = np.array([values[d].mean() for d in draws])
        low, high = np.quantile(samples, [tail, 1 - tail])
        return Estimate(float(values.mean()), float(low), float(high))

    def recovered(draw: np.ndarray | slice) -> float:
        w, oracle = per_question["w_router"][draw].mean(), per_question["oracle"][draw].mean()
        # The best single worker is re-chosen on each resample, as it would be on that sample.
        best = y[draw].mean(axis=0).max()
        return float((w - best) / (oracle - best)) if oracle > best else float("nan")

    recovered_samples = np.array([recovered(d) for d in draws])
    low, high = np.nanquantile(recovered_samples, [tail, 1 - tail]) if np.isfinite(recovered_samples).any() else (np.nan, np.nan)
    note = ""
    if settings.lambda_cost > 0 and np.all(cost != cost):
        note = "lambda_cost was set but the telemetry has no cost: the W-router ranked on P(success) alone."
    return RoutingReport(
        pool=pool_name,
        workers=sorted(order),
        n_questions=n_questions,
        accuracy={arm: estimate(values) for arm, values in per_question.items()},
        best_single_worker=best_worker,
        headroom_recovered=Estimate(recovered(slice(None)), float(low), float(high)),
        lambda_cost=settings.lambda_cost,
        note=note,
        population=population,
    )
