"""How W and the baselines are scored, out of fold: log loss, Brier, ROC AUC and expected
calibration error, each with a bootstrap interval that resamples *questions*; the paired difference
W - baseline on the same resamples; reliability curves; and one split's scores (`SplitReport`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from conductor_pipeline.stats import question_resample_counts

# Bins of the reliability diagram and of the expected calibration error (equal width).
CALIBRATION_BINS = 15
# Predictions are clipped away from 0 and 1 before log loss, for every model alike.
PROBABILITY_EPS = 1e-4
METRICS = ("log_loss", "brier", "roc_auc", "ece")
LOWER_IS_BETTER = {"log_loss": True, "brier": True, "roc_auc": False, "ece": True}
W_NAME = "world_model"


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def fmt(self, digits: int = 4) -> str:
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


@dataclass(frozen=True)
class Comparison:
    """W minus one baseline on one metric, paired over the same question resamples."""

    baseline: str
    metric: str
    difference: Estimate

    @property
    def w_better(self) -> bool:
        """The whole interval is on W's good side of 0."""
        if LOWER_IS_BETTER[self.metric]:
            return self.difference.high < 0
        return self.difference.low > 0

    @property
    def w_worse(self) -> bool:
        if LOWER_IS_BETTER[self.metric]:
            return self.difference.low > 0
        return self.difference.high < 0


@dataclass
class SplitReport:
    name: str
    description: str
    n_rows: int
    n_questions: int
    n_workers: int
    n_folds: int
    scores: dict[str, dict[str, Estimate]]  # model -> metric -> estimate
    comparisons: list[Comparison]
    reliability: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # model -> (mean predicted, observed, count)
    note: str = ""  # how to read a baseline whose figures coincide with another's

    def comparison(self, baseline: str, metric: str = "log_loss") -> Comparison:
        return next(c for c in self.comparisons if c.baseline == baseline and c.metric == metric)

    def beats(self, baseline: str, metric: str = "log_loss") -> bool:
        return self.comparison(baseline, metric).w_better

    @property
    def verdict(self) -> str:
        """One line: does W beat each baseline on log loss, by how much, and is the interval clear of 0."""
        parts = []
        for comparison in (c for c in self.comparisons if c.metric == "log_loss"):
            d = comparison.difference
            if comparison.w_better or comparison.w_worse:
                outcome = "BEATS" if comparison.w_better else "LOSES TO"
                clear = "interval excludes 0"
            else:
                outcome, clear = "does not clearly beat", "interval includes 0"
            parts.append(
                f"{outcome} {comparison.baseline}: log loss W - baseline {d.value:+.4f} "
                f"({clear}: [{d.low:+.4f}, {d.high:+.4f}])"
            )
        return f"{self.name}: W " + "; ".join(parts)


def calibration_bins(p: np.ndarray) -> np.ndarray:
    """The equal-width probability bin of each prediction (1.0 goes in the top bin)."""
    return np.minimum((p * CALIBRATION_BINS).astype(np.int64), CALIBRATION_BINS - 1)


def expected_calibration_error(
    y: np.ndarray, p: np.ndarray, weights: np.ndarray | None = None, *, bins: np.ndarray | None = None
) -> float:
    """Weighted mean |observed - predicted| over equal-width probability bins (`bins`: precomputed
    `calibration_bins(p)`, for callers that score many weightings of the same predictions)."""
    weights = np.ones_like(p) if weights is None else weights
    bins = calibration_bins(p) if bins is None else bins
    total = np.bincount(bins, weights, CALIBRATION_BINS)
    predicted = np.bincount(bins, weights * p, CALIBRATION_BINS)
    observed = np.bincount(bins, weights * y, CALIBRATION_BINS)
    return float(np.abs(observed - predicted).sum() / total.sum())


def _metrics(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """Point metrics with scikit-learn."""
    from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score  # noqa: PLC0415 (heavy)

    clipped = np.clip(p, PROBABILITY_EPS, 1 - PROBABILITY_EPS)
    return {
        "log_loss": float(log_loss(y, clipped, labels=[0, 1])),
        "brier": float(brier_score_loss(y, p)),
        "roc_auc": float(roc_auc_score(y, p)) if len(np.unique(y)) > 1 else float("nan"),
        "ece": expected_calibration_error(y, p),
    }


class _WeightedMetrics:
    """The same four metrics under row weights, vectorised for hundreds of bootstrap resamples.

    scikit-learn's per-call validation costs tens of milliseconds, times resamples x models;
    these equal its weighted results (checked in the tests): ties in ROC AUC count one half.
    """

    def __init__(self, y: np.ndarray, p: np.ndarray) -> None:
        self.y = y
        self.p = p
        clipped = np.clip(p, PROBABILITY_EPS, 1 - PROBABILITY_EPS)
        self.row_log_loss = -(y * np.log(clipped) + (1 - y) * np.log(1 - clipped))
        self.row_brier = (p - y) ** 2
        _, self.score_rank = np.unique(p, return_inverse=True)  # ascending distinct scores
        self.n_scores = int(self.score_rank.max()) + 1
        self.bins = calibration_bins(p)

    def __call__(self, weights: np.ndarray) -> list[float]:
        total = weights.sum()
        positives = np.bincount(self.score_rank, weights * self.y, self.n_scores)
        negatives = np.bincount(self.score_rank, weights * (1 - self.y), self.n_scores)
        below = np.cumsum(negatives) - negatives
        pairs = positives.sum() * negatives.sum()
        auc = float((positives * (below + 0.5 * negatives)).sum() / pairs) if pairs > 0 else float("nan")
        return [
            float(weights @ self.row_log_loss / total),
            float(weights @ self.row_brier / total),
            auc,
            expected_calibration_error(self.y, self.p, weights, bins=self.bins),
        ]


def reliability_curve(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bins = calibration_bins(p)
    count = np.bincount(bins, minlength=CALIBRATION_BINS).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.bincount(bins, p, CALIBRATION_BINS) / count
        observed = np.bincount(bins, y, CALIBRATION_BINS) / count
    return mean_p, observed, count


def score_predictions(
    y: np.ndarray,
    predictions: Mapping[str, np.ndarray],
    question_ids: np.ndarray,
    *,
    n_bootstrap: int,
    confidence: float,
    seed: int,
) -> tuple[dict[str, dict[str, Estimate]], list[Comparison]]:
    """Point metrics and bootstrap intervals per model, and paired W - baseline differences."""
    _, codes = np.unique(question_ids, return_inverse=True)
    n_questions = int(codes.max()) + 1
    resamples = [counts[codes] for counts in question_resample_counts(n_questions, n_bootstrap, seed)]
    point = {name: _metrics(y, p) for name, p in predictions.items()}
    draws = {}
    for name, p in predictions.items():
        weighted = _WeightedMetrics(y, p)
        draws[name] = np.array([weighted(w) for w in resamples])
    tail = (1 - confidence) / 2

    def interval(value: float, samples: np.ndarray) -> Estimate:
        low, high = np.nanquantile(samples, [tail, 1 - tail])
        return Estimate(value, float(low), float(high))

    scores = {
        name: {m: interval(point[name][m], draws[name][:, i]) for i, m in enumerate(METRICS)} for name in predictions
    }
    comparisons = [
        Comparison(
            baseline=name,
            metric=m,
            difference=interval(point[W_NAME][m] - point[name][m], draws[W_NAME][:, i] - draws[name][:, i]),
        )
        for name in predictions
        if name != W_NAME
        for i, m in enumerate(METRICS)
    ]
    return scores, comparisons
