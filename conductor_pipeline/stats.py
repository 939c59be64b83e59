"""Binomial confidence intervals for pass rates and accuracies, vectorised over arrays.

A pass rate from k samples is an estimate, not a fact: 3/6 and 300/600 both read 0.5, and only
the interval says which one can gate a training run. Both intervals stay inside [0, 1] and stay
informative at 0/k and k/k, where the textbook normal interval collapses to a point.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import beta, norm

DEFAULT_CONFIDENCE = 0.95


def _counts(successes: ArrayLike, trials: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(successes, dtype=float)
    n = np.asarray(trials, dtype=float)
    if np.any(n < 0) or np.any(s < 0) or np.any(s > n):
        raise ValueError("need 0 <= successes <= trials")
    return np.broadcast_arrays(s, n)


def wilson_interval(
    successes: ArrayLike, trials: ArrayLike, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval (lower, upper); (0, 1) where there are no trials."""
    s, n = _counts(successes, trials)
    z = norm.ppf(0.5 + confidence / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = s / n
        denominator = 1 + z**2 / n
        center = (p + z**2 / (2 * n)) / denominator
        half = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / denominator
        lower = np.clip(center - half, 0.0, 1.0)
        upper = np.clip(center + half, 0.0, 1.0)
    # At 0/n and n/n the formula's end is exactly 0 or 1; pin it against rounding (and n == 0).
    return np.where(s == 0, 0.0, lower), np.where(s == n, 1.0, upper)


def jeffreys_interval(
    successes: ArrayLike, trials: ArrayLike, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[np.ndarray, np.ndarray]:
    """Jeffreys interval: equal-tailed Beta(s+1/2, n-s+1/2) quantiles, ends pinned at 0/n and n/n."""
    s, n = _counts(successes, trials)
    tail = (1 - confidence) / 2
    lower = beta.ppf(tail, s + 0.5, n - s + 0.5)
    upper = beta.ppf(1 - tail, s + 0.5, n - s + 0.5)
    lower = np.where(s == 0, 0.0, lower)
    upper = np.where(s == n, 1.0, upper)
    return lower, upper
