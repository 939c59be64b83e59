"""Out-of-sample machinery of the world-model evaluation: its settings, the marginal baselines
(refitted per fold on the training rows only), the folds (GroupKFold over questions; workers of one
family spread over different folds), and W's and the baselines' out-of-fold predictions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.world_model.features import WorldModelSettings
from conductor_pipeline.world_model.metrics import W_NAME
from conductor_pipeline.world_model.model import WorldModel


class EvaluationSettings(BaseModel):
    """Knobs of the out-of-sample evaluation (their descriptions are the Dagster config's help text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    question_folds: int = Field(5, ge=2, description="GroupKFold folds over questions")
    worker_folds: int = Field(5, ge=2, description="GroupKFold folds over workers for the held-out-worker split")
    held_out_workers: bool = Field(True, description="Run the held-out-worker split")
    n_bootstrap: int = Field(200, ge=10, description="Question resamples for every interval")
    confidence: float = Field(0.95, gt=0, lt=1)
    smoothing: float = Field(
        20.0, ge=0, description="Pseudo-count pulling a sparse cell's rate toward its parent rate (worker x subject -> worker)"
    )
    lambda_cost: float = Field(0.0, ge=0, description="Router score = P(success) - lambda x predicted cost (USD)")
    routing_pools: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Named worker lists to route among; empty: one pool of the workers that answered nearly every question",
    )
    routing_min_coverage: float = Field(
        0.98, gt=0, le=1, description="Automatic pool: workers answering at least this share of the questions"
    )
    model: WorldModelSettings = WorldModelSettings()
    seed: int = 0


def _smoothed_rates(
    train: pl.DataFrame, keys: list[str], parent: pl.DataFrame, parent_keys: list[str], strength: float, name: str
) -> pl.DataFrame:
    """Rate per cell, pulled toward the parent cell's rate with `strength` pseudo-counts."""
    cells = train.group_by(keys).agg(hits=pl.col("y").sum(), n=pl.len())
    if parent_keys:
        cells = cells.join(parent, on=parent_keys, how="left")
    else:
        cells = cells.join(parent, how="cross")
    return cells.select(*keys, ((pl.col("hits") + strength * pl.col("parent")) / (pl.col("n") + strength)).alias(name))


def baseline_predictions(
    train: pl.DataFrame, test: pl.DataFrame, seats: Mapping[str, WorkerSeat], smoothing: float, *, held_out_workers: bool
) -> dict[str, np.ndarray]:
    """Each baseline's P(success) for the test rows, fitted on the training rows only."""

    def prepared(frame: pl.DataFrame) -> pl.DataFrame:
        # A worker without a catalogue family has none: it must not pool with other unknowns.
        return frame.with_columns(
            y=pl.col("correct").cast(pl.Float64),
            group=pl.coalesce("subject", "corpus", pl.lit("unknown")),
            level_key=pl.col("level").fill_null(-1),
            family=pl.col("worker").replace_strict(catalogue_families(seats), default=None, return_dtype=pl.String),
        )

    train, test = prepared(train), prepared(test)
    global_rate = pl.DataFrame({"parent": [float(train["y"].mean())]})
    out: dict[str, np.ndarray] = {}

    def attach(rates: pl.DataFrame, keys: list[str], name: str, fallback: pl.Expr) -> np.ndarray:
        joined = test.select(*keys, row=pl.int_range(pl.len())).join(rates, on=keys, how="left").sort("row")
        return joined.with_columns(fallback_value=fallback).select(pl.coalesce(name, "fallback_value"))[name].to_numpy()

    g = float(train["y"].mean())
    if not held_out_workers:
        worker = _smoothed_rates(train, ["worker"], global_rate, [], smoothing, "p")
        out["worker_marginal"] = attach(worker, ["worker"], "p", pl.lit(g))
        worker_parent = worker.rename({"p": "parent"})
        subject = _smoothed_rates(train, ["worker", "group"], worker_parent, ["worker"], smoothing, "p")
        subject_pred = attach(subject, ["worker", "group"], "p", pl.lit(None))
        out["worker_x_subject"] = np.where(np.isnan(subject_pred), out["worker_marginal"], subject_pred)
        level = _smoothed_rates(
            train, ["worker", "group", "level_key"], subject.rename({"p": "parent"}), ["worker", "group"], smoothing, "p"
        )
        level_pred = attach(level, ["worker", "group", "level_key"], "p", pl.lit(None))
        out["worker_x_subject_x_level"] = np.where(np.isnan(level_pred), out["worker_x_subject"], level_pred)
    else:
        out["global_rate"] = np.full(test.height, g)
        with_family = train.filter(pl.col("family").is_not_null())
        family = _smoothed_rates(with_family, ["family"], global_rate, [], smoothing, "p")
        out["family_marginal"] = np.nan_to_num(attach(family, ["family"], "p", pl.lit(g)), nan=g)
        question = _smoothed_rates(train, ["question_id"], global_rate, [], 1.0, "p")
        out["question_rate_other_workers"] = np.nan_to_num(attach(question, ["question_id"], "p", pl.lit(g)), nan=g)
    return {name: np.nan_to_num(pred.astype(np.float64), nan=g) for name, pred in out.items()}


def catalogue_families(seats: Mapping[str, WorkerSeat]) -> dict[str, str]:
    """worker -> catalogue family, for the seats that name one."""
    return {name: seat.family for name, seat in seats.items() if seat.family}


def family_spread_worker_folds(workers: Sequence[str], families: Mapping[str, str], n_folds: int) -> dict[str, int]:
    """The fold of each worker: workers sorted by (family, name) are dealt round-robin, so the workers
    of one family land in different folds (up to `n_folds` of them) and a held-out worker's family
    is seen in training whenever the family has another worker."""
    ordered = sorted(workers, key=lambda w: (families.get(w) is None, families.get(w) or "", w))
    return {worker: index % n_folds for index, worker in enumerate(ordered)}


def held_out_worker_folds(
    frame: pl.DataFrame, families: Mapping[str, str], n_folds: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train rows, test rows) per fold of workers (`family_spread_worker_folds`)."""
    workers = frame["worker"].unique().sort().to_list()
    fold_of = family_spread_worker_folds(workers, families, min(n_folds, len(workers)))
    row_fold = frame["worker"].replace_strict(fold_of, return_dtype=pl.Int64).to_numpy()
    return [(np.flatnonzero(row_fold != f), np.flatnonzero(row_fold == f)) for f in sorted(set(fold_of.values()))]


def family_fallback_note(workers: Sequence[str], families: Mapping[str, str]) -> str:
    """How family_marginal relates to global_rate in the held-out-worker split, and why."""
    members: dict[str, list[str]] = {}
    for worker in workers:
        if families.get(worker):
            members.setdefault(families[worker], []).append(worker)
    alone = sorted(w for w in workers if len(members.get(families.get(w, ""), [])) < 2)
    if not alone:
        return "Every held-out worker has another worker of its family in training, so family_marginal is informed."
    why = ("no other worker of its catalogue family (or no family at all) is in the data, so its family rate is the "
           "global rate")
    if len(alone) == len(workers):
        return (f"family_marginal equals global_rate on every row by construction: for every held-out worker {why}. "
                "It becomes informative only with two or more workers of one family.")
    informed = sorted(set(workers) - set(alone))
    return (f"family_marginal equals global_rate for {len(alone)} of {len(workers)} held-out workers "
            f"({', '.join(alone)}): for each, {why}. It differs only for {', '.join(informed)}.")


def question_folds(frame: pl.DataFrame, n_folds: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train rows, test rows) per fold, grouped by question: no question is on both sides."""
    from sklearn.model_selection import GroupKFold  # noqa: PLC0415 (heavy: imported where W is evaluated)

    groups = frame["question_id"].to_numpy()
    folds = GroupKFold(n_splits=min(n_folds, len(np.unique(groups))))
    return list(folds.split(np.zeros(frame.height), groups=groups))


def out_of_fold_predictions(
    frame: pl.DataFrame,
    seats: Mapping[str, WorkerSeat],
    settings: EvaluationSettings,
    *,
    folds: Sequence[tuple[np.ndarray, np.ndarray]],
    held_out_workers: bool,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Out-of-fold predictions of W and the baselines for every row; W's cost predictions too."""
    predictions: dict[str, np.ndarray] = {}
    cost = np.full(frame.height, np.nan)
    model_settings = settings.model
    if held_out_workers:
        model_settings = model_settings.model_copy(
            update={"exclude_features": tuple(sorted({*model_settings.exclude_features, "worker"}))}
        )
    for train_idx, test_idx in folds:
        train, test = frame[train_idx], frame[test_idx]
        model = WorldModel.fit(train, seats, model_settings)
        features = model.features_for(test)  # built once for both boosters (text features are the cost)
        fold_predictions = {W_NAME: model.success_booster.predict(features, num_threads=1)}
        if model.cost_booster is not None:
            cost[test_idx] = np.maximum(model.cost_booster.predict(features), 0.0)
        fold_predictions |= baseline_predictions(train, test, seats, settings.smoothing, held_out_workers=held_out_workers)
        for name, values in fold_predictions.items():
            predictions.setdefault(name, np.full(frame.height, np.nan))[test_idx] = values
    return predictions, cost
