"""The world model W(subtask, worker) -> P(success), expected cost, expected latency."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_of, train_split_rows
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.data import load_training_frame, normalize_training_frame, rows_by_source
from conductor_pipeline.world_model.features import (
    CATEGORICAL_FEATURES,
    CategoryVocabulary,
    FeatureColumns,
    TextFeaturizer,
    WorldModelSettings,
    build_features,
    make_text_featurizer,
)

if TYPE_CHECKING:
    import lightgbm as lgb

# --- the model ---------------------------------------------------------------------------------


@dataclass
class RegressorInfo:
    """What one auxiliary target (cost or latency) was trained on, or why it was not."""

    trained: bool
    n_rows: int
    note: str


@dataclass
class WorldModel:
    """A fitted W: success classifier, optional cost/latency regressors, and their feature state."""

    settings: WorldModelSettings
    seats: dict[str, WorkerSeat]
    vocabulary: CategoryVocabulary
    text_model: TextFeaturizer | None
    feature_names: list[str]
    kept_columns: list[int]
    success_booster: lgb.Booster
    cost_booster: lgb.Booster | None = None
    latency_booster: lgb.Booster | None = None
    cost_info: RegressorInfo = field(default_factory=lambda: RegressorInfo(False, 0, "not fitted"))
    latency_info: RegressorInfo = field(default_factory=lambda: RegressorInfo(False, 0, "not fitted"))
    training_summary: dict[str, Any] = field(default_factory=dict)
    # Every question W saw in training, so a leak check can prove none is on the eval side.
    training_question_ids: frozenset[str] = frozenset()

    # -- fitting --------------------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        frame: pl.DataFrame,
        seats: Mapping[str, WorkerSeat],
        settings: WorldModelSettings | None = None,
    ) -> WorldModel:
        """Train on scored rows of a training frame (see world_model_data)."""
        settings = settings or WorldModelSettings()
        frame = normalize_training_frame(frame).filter(pl.col("correct").is_not_null())
        if frame.is_empty():
            raise ValueError("no scored rows to train the world model on")
        seats = dict(seats)
        text_model = make_text_featurizer(settings)
        if text_model is not None:
            text_model.fit(frame["subtask"].fill_null("").to_list())
        vocabulary = CategoryVocabulary.from_data(frame, seats)
        features, names = build_features(frame, seats, text_model=text_model, vocabulary=vocabulary)
        unknown = set(settings.exclude_features) - set(names)
        if unknown:
            raise ValueError(f"exclude_features names unknown features {sorted(unknown)}; known: {names}")
        kept = [i for i, name in enumerate(names) if name not in settings.exclude_features]
        kept_names = [names[i] for i in kept]
        categorical = [name for name in kept_names if name in CATEGORICAL_FEATURES]
        features = features[:, kept]
        labels = frame["correct"].cast(pl.Float32).to_numpy()
        groups = frame["question_id"].to_numpy()

        success, rounds, validation_logloss = _fit_with_early_stopping(
            features, labels, groups, kept_names, categorical, settings, objective="binary"
        )
        model = cls(
            settings=settings,
            seats=seats,
            vocabulary=vocabulary,
            text_model=text_model,
            feature_names=names,
            kept_columns=kept,
            success_booster=success,
            training_question_ids=frozenset(frame["question_id"].unique().to_list()),
        )
        model.cost_booster, model.cost_info = _fit_regressor(
            frame, "cost_usd", features, groups, kept_names, categorical, settings, mask=None
        )
        replay_workers = [name for name, seat in seats.items() if seat.is_replay]
        real_latency = ~frame["worker"].is_in(replay_workers).to_numpy()
        model.latency_booster, model.latency_info = _fit_regressor(
            frame, "latency_s", features, groups, kept_names, categorical, settings, mask=real_latency
        )
        if model.cost_info.trained:
            estimated = float(frame.filter(pl.col("cost_usd").is_not_null())["tokens_estimated"].fill_null(False).mean())
            if estimated > 0:
                model.cost_info.note += f"; {estimated:.0%} of these costs come from estimated token counts (replay)"
        if not real_latency.any():
            model.latency_info = RegressorInfo(False, 0, "not trained: every row is a replay call, which has no real latency")
        model.training_summary = {
            "rows": frame.height,
            "rows_by_source": rows_by_source(frame),
            "questions": frame["question_id"].n_unique(),
            "workers": frame["worker"].n_unique(),
            "base_rate": round(float(labels.mean()), 4),
            "features": len(kept_names),
            "text_representation": settings.text_representation,
            "boosting_rounds": int(rounds),
            "early_stopping_logloss": None if validation_logloss is None else round(float(validation_logloss), 4),
        }
        return model

    # -- inference ------------------------------------------------------------------------------

    def features_for(
        self, frame: pl.DataFrame | FeatureColumns, seats: Mapping[str, WorkerSeat] | None = None
    ) -> np.ndarray:
        """The model's input matrix, through the same `build_features` as training.

        `seats` adds catalogue entries for workers the model was not trained with.
        """
        catalogue = self.seats if not seats else {**self.seats, **seats}
        features, _ = build_features(frame, catalogue, text_model=self.text_model, vocabulary=self.vocabulary)
        return features[:, self.kept_columns]

    def predict_frame(self, frame: pl.DataFrame | FeatureColumns, seats: Mapping[str, WorkerSeat] | None = None) -> np.ndarray:
        """P(success) for each row of a frame with `worker` and `subtask` (and optional metadata)."""
        return self.success_booster.predict(self.features_for(frame, seats), num_threads=1)

    @staticmethod
    def _cross(
        subtasks: Sequence[Question | str] | pl.DataFrame, workers: Sequence[WorkerSeat | str]
    ) -> tuple[FeatureColumns, int, dict[str, WorkerSeat]]:
        """Every (subtask, worker) pair as feature columns, subtask-major."""
        names = [w.name if isinstance(w, WorkerSeat) else w for w in workers]
        given = {w.name: w for w in workers if isinstance(w, WorkerSeat)}
        rows = _subtask_rows(subtasks)
        n = len(names)
        return (
            FeatureColumns(
                workers=names * len(rows),
                subtasks=[r[0] for r in rows for _ in range(n)],
                problems=[r[1] for r in rows for _ in range(n)],
                corpora=[r[2] for r in rows for _ in range(n)],
                subjects=[r[3] for r in rows for _ in range(n)],
                levels=[r[4] for r in rows for _ in range(n)],
                visible_steps=[r[5] for r in rows for _ in range(n)],
            ),
            n,
            given,
        )

    def predict_success(
        self, subtasks: Sequence[Question | str] | pl.DataFrame, workers: Sequence[WorkerSeat | str]
    ) -> np.ndarray:
        """P(success), shape (len(subtasks), len(workers)), scored in one batch.

        `subtasks` are Questions (whole-question calls, with metadata), plain subtask texts (both
        asked alone: no earlier step results), or a frame with `subtask` (and optionally
        problem/corpus/subject/level/visible_steps). Workers are seats
        (catalogue attributes come from them, so an unseen worker gets a prediction) or names of
        seats known to the model.
        """
        columns, n_workers, given = self._cross(subtasks, workers)
        return self.predict_frame(columns, given).reshape(-1, n_workers)

    def predict_cost(
        self, subtasks: Sequence[Question | str] | pl.DataFrame, workers: Sequence[WorkerSeat | str]
    ) -> np.ndarray:
        """Expected cost in USD, same shape as predict_success; NaN when no cost regressor was trained."""
        return self._predict_regressor(self.cost_booster, subtasks, workers)

    def predict_latency(
        self, subtasks: Sequence[Question | str] | pl.DataFrame, workers: Sequence[WorkerSeat | str]
    ) -> np.ndarray:
        """Expected latency in seconds; NaN when the telemetry had no real latency."""
        return self._predict_regressor(self.latency_booster, subtasks, workers)

    def _predict_regressor(
        self, booster: lgb.Booster | None, subtasks: Sequence[Question | str] | pl.DataFrame, workers: Sequence[WorkerSeat | str]
    ) -> np.ndarray:
        columns, n_workers, given = self._cross(subtasks, workers)
        if booster is None:
            return np.full((len(columns.workers) // max(1, n_workers), n_workers), np.nan)
        predicted = booster.predict(self.features_for(columns, given), num_threads=1)
        return np.maximum(predicted, 0.0).reshape(-1, n_workers)

    # -- reporting and persistence --------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """What was trained on what, including which targets were NOT trained and why."""
        return {
            **self.training_summary,
            "success": "LightGBM binary classifier",
            "cost": self.cost_info.note,
            "latency": self.latency_info.note,
            "excluded_features": list(self.settings.exclude_features),
        }

    def feature_importance(self) -> dict[str, float]:
        gains = self.success_booster.feature_importance(importance_type="gain")
        kept_names = [self.feature_names[i] for i in self.kept_columns]
        total = float(gains.sum()) or 1.0
        return dict(sorted(((n, float(g) / total) for n, g in zip(kept_names, gains)), key=lambda kv: -kv[1]))


def _subtask_rows(
    subtasks: Sequence[Question | str] | pl.DataFrame,
) -> list[tuple[str, str | None, str | None, str | None, int | None, int | None]]:
    """(subtask, problem, corpus, subject, level, visible_steps) per subtask; a Question is a
    whole-question call, and a Question or a plain text is asked alone (0 visible steps)."""
    if isinstance(subtasks, pl.DataFrame):
        frame = normalize_training_frame(subtasks.with_columns(worker=pl.lit("")) if "worker" not in subtasks.columns else subtasks)
        return list(frame.select("subtask", "problem", "corpus", "subject", "level", "visible_steps").iter_rows())
    return [
        (item.problem, item.problem, item.corpus, item.subject, item.level, 0)
        if isinstance(item, Question)
        else (item, None, None, None, None, 0)
        for item in subtasks
    ]


def _fit_with_early_stopping(
    features: np.ndarray,
    target: np.ndarray,
    groups: np.ndarray,
    names: list[str],
    categorical: list[str],
    settings: WorldModelSettings,
    *,
    objective: str,
) -> tuple[lgb.Booster, int, float | None]:
    """Pick the round count on held-out *questions*, then (by default) refit on everything."""
    import lightgbm as lgb  # noqa: PLC0415 (heavy: imported where W is fitted)
    from sklearn.model_selection import GroupShuffleSplit  # noqa: PLC0415 (heavy: imported where W is fitted)

    params = settings.lgb_params(objective)
    n_groups = len(np.unique(groups))
    if n_groups < 10:
        data = lgb.Dataset(features, target, feature_name=names, categorical_feature=categorical, free_raw_data=False)
        rounds = min(settings.num_boost_round, 100)
        return lgb.train(params, data, num_boost_round=rounds), rounds, None
    splitter = GroupShuffleSplit(n_splits=1, test_size=settings.validation_share, random_state=settings.seed)
    train_idx, valid_idx = next(splitter.split(features, target, groups))
    train = lgb.Dataset(features[train_idx], target[train_idx], feature_name=names, categorical_feature=categorical, free_raw_data=False)
    valid = lgb.Dataset(features[valid_idx], target[valid_idx], reference=train)
    booster = lgb.train(
        params,
        train,
        num_boost_round=settings.num_boost_round,
        valid_sets=[valid],
        callbacks=[lgb.early_stopping(settings.early_stopping_rounds, verbose=False)],
    )
    rounds = max(1, booster.best_iteration or settings.num_boost_round)
    metric = next(iter(booster.best_score.get("valid_0", {}).values()), None)
    if not settings.refit_on_all:
        return booster, rounds, metric
    full = lgb.Dataset(features, target, feature_name=names, categorical_feature=categorical, free_raw_data=False)
    return lgb.train(params, full, num_boost_round=rounds), rounds, metric


def _fit_regressor(
    frame: pl.DataFrame,
    column: str,
    features: np.ndarray,
    groups: np.ndarray,
    names: list[str],
    categorical: list[str],
    settings: WorldModelSettings,
    *,
    mask: np.ndarray | None,
) -> tuple[lgb.Booster | None, RegressorInfo]:
    values = frame[column].to_numpy().astype(np.float64)
    usable = ~np.isnan(values)
    if mask is not None:
        usable &= mask
    count = int(usable.sum())
    if count < settings.min_regression_rows:
        return None, RegressorInfo(False, count, f"not trained: {count} rows have {column} (need {settings.min_regression_rows})")
    booster, _, _ = _fit_with_early_stopping(
        features[usable], values[usable], groups[usable], names, categorical, settings, objective="regression"
    )
    return booster, RegressorInfo(True, count, f"LightGBM regressor on {count} rows with {column}")


# --- uses --------------------------------------------------------------------------------------


def fit_on_train_split(
    frame: pl.DataFrame,
    seats: Mapping[str, WorkerSeat],
    settings: WorldModelSettings | None = None,
    *,
    split_fn: Callable[[str], str] = split_of,
) -> WorldModel:
    """W fitted on the seats' rows of TRAIN-split questions only: the W that may route or prompt
    on eval questions (the `world_model` asset's W saw every question, eval ones included)."""
    rows = train_split_rows(frame, list(seats), split_fn=split_fn)
    if rows.filter(pl.col("correct").is_not_null()).is_empty():
        raise ValueError(f"no scored train-split rows for workers {sorted(seats)}: probe the pool first")
    return WorldModel.fit(rows, seats, settings)


def fit_train_split_world_model(
    store: Warehouse, pool: str, seats: Sequence[WorkerSeat], settings: WorldModelSettings | None = None
) -> WorldModel:
    """`fit_on_train_split` on the pool's probe rows for these seats (the eval run's W: it routes
    the W-router and fills '+W' prompts, so it reads what the training prompts' W reads)."""
    frame = load_training_frame(store, pool=pool, probes_only=True)
    return fit_on_train_split(frame, {seat.name: seat for seat in seats}, settings)
