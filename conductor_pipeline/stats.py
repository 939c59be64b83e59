"""Intervals and paired tests: how sure a pass rate is, and whether one arm beats another.

A pass rate from k samples is an estimate, not a fact: 3/6 and 300/600 both read 0.5, and only
the interval says which one can gate a training run. The Wilson interval stays inside [0, 1] and
stays informative at 0/k and k/k, where the textbook normal interval collapses to a point.

Two arms scored on the same questions are compared *paired*: the questions are the unit of
sampling, so the bootstrap resamples questions (each question's repeats stay together, as its mean)
and the exact McNemar test reads only the questions where the two disagree. Any report that
compares arms (evaluation, the world model's routing, a pool search) uses `compare_paired`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

import numpy as np
from numpy.typing import ArrayLike

DEFAULT_CONFIDENCE = 0.95
# Question resamples of every paired bootstrap: the 2.5% and 97.5% quantiles of 2,000 draws move
# by well under a point of accuracy between seeds on a few hundred questions.
DEFAULT_BOOTSTRAP_RESAMPLES = 2000
Verdict = Literal["beats", "ties", "loses"]
K = TypeVar("K")


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
    from scipy.stats import norm  # noqa: PLC0415 (scipy.stats loads in seconds; the definitions import this module)

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


# ---------------------------------------------------------------------- paired comparisons


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its interval (NaN ends: no interval could be formed)."""

    value: float
    low: float
    high: float

    def excludes_zero(self) -> bool:
        return bool(self.low > 0 or self.high < 0)


@dataclass(frozen=True)
class PairedComparison:
    """An arm against a reference on the questions both reached.

    `difference` is arm - reference accuracy (bootstrap over questions); `arm_only` and
    `reference_only` count the discordant questions (by each question's majority verdict) that
    `mcnemar_p` tests; `headroom_recovered` is APGR, (arm - reference) / (oracle - reference),
    None without an oracle or when the oracle has no headroom over the reference.
    """

    n_questions: int
    arm_accuracy: float
    reference_accuracy: float
    difference: Estimate
    arm_only: int
    reference_only: int
    mcnemar_p: float
    headroom_recovered: Estimate | None = None
    # The bootstrap's two-sided p-value of no difference (from the interval's draws), and the same
    # after Holm's correction over the table it is one comparison of (`holm_family`); None: alone.
    p_value: float = 1.0
    p_holm: float | None = None
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def p_decisive(self) -> float:
        """The p-value the verdict reads: Holm-adjusted when the comparison is one of a family."""
        return self.p_value if self.p_holm is None else self.p_holm

    @property
    def verdict(self) -> Verdict:
        """beats / loses when the bootstrap's (Holm-adjusted) p-value is under 1 - confidence and the
        difference is above / below 0, else ties. Alone, that is the difference's interval lying wholly
        above / below 0; McNemar's p is descriptive (it reads only the discordant questions)."""
        return verdict_of(self.difference.value, self.p_decisive, 1 - self.confidence)


def verdict_of(difference: float, p_value: float, alpha: float = 1 - DEFAULT_CONFIDENCE) -> Verdict:
    if p_value >= alpha or difference == 0:
        return "ties"
    return "beats" if difference > 0 else "loses"


def bootstrap_p_value(draws: np.ndarray) -> float:
    """Two-sided p-value of a zero difference from its bootstrap draws: twice the smaller tail at 0,
    so that it is under 1 - c exactly when the equal-tailed c interval leaves 0 out."""
    finite = draws[np.isfinite(draws)]
    if finite.size == 0:
        return 1.0
    return float(min(1.0, 2 * min(np.mean(finite <= 0), np.mean(finite >= 0))))


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values, in the order given.

    The i-th smallest of m p-values becomes (m - i) times itself (i from 0), raised to the largest
    adjusted value before it and capped at 1. statsmodels' `multipletests(method="holm")` computes
    the same (the tests hold the two equal) but runs `gc.collect()` on every call, a full pass over a
    heap that holds torch and Dagster, 0.3-0.5 s a call in an evaluation.
    """
    p = np.asarray(p_values, dtype=float)
    if p.size == 0:
        return []
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(p[order] * np.arange(p.size, 0, -1))
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(stepped, 1.0)
    return [float(value) for value in adjusted]


def holm_family(comparisons: Mapping[K, PairedComparison]) -> dict[K, PairedComparison]:
    """The comparisons of one table with their p-values Holm-adjusted over all of them: a table that
    holds many arms against shared references makes many tests, and its verdicts say so."""
    keys = list(comparisons)
    adjusted = holm_adjusted([comparisons[key].p_value for key in keys])
    return {key: replace(comparisons[key], p_holm=p) for key, p in zip(keys, adjusted, strict=True)}


def mcnemar_exact_p(arm_only: int, reference_only: int) -> float:
    """Two-sided exact McNemar p-value: the discordant questions as a Binomial(n, 1/2) test.

    1.0 when the two never disagree (no evidence either way).
    """
    if arm_only < 0 or reference_only < 0:
        raise ValueError(f"discordant counts must be >= 0, got {arm_only} and {reference_only}")
    from scipy.stats import binomtest  # noqa: PLC0415 (scipy.stats loads in seconds)

    discordant = arm_only + reference_only
    if discordant == 0:
        return 1.0
    return float(binomtest(arm_only, discordant, 0.5, alternative="two-sided").pvalue)


def question_resamples(
    n_questions: int, n_resamples: int = DEFAULT_BOOTSTRAP_RESAMPLES, seed: int = 0
) -> np.ndarray:
    """Bootstrap draws of question indices, shape (n_resamples, n_questions). Passing the same draws
    to every statistic of one report pairs all its intervals."""
    if n_questions <= 0:
        raise ValueError("a bootstrap needs at least one question")
    return np.random.default_rng(seed).integers(0, n_questions, size=(n_resamples, n_questions))


def question_resample_counts(
    n_questions: int, n_resamples: int = DEFAULT_BOOTSTRAP_RESAMPLES, seed: int = 0
) -> np.ndarray:
    """How often each question is drawn in each resample, shape (n_resamples, n_questions): the
    draws of `question_resamples`, for statistics that weight rows rather than index them (a row
    of a question drawn twice counts twice)."""
    draws = question_resamples(n_questions, n_resamples, seed)
    offsets = draws + n_questions * np.arange(n_resamples)[:, None]
    return np.bincount(offsets.ravel(), minlength=n_resamples * n_questions).reshape(n_resamples, n_questions).astype(float)


def percentile_interval(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    """The equal-tailed percentile interval of bootstrap draws, ignoring draws that are not finite."""
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return float("nan"), float("nan")
    tail = (1 - confidence) / 2
    low, high = np.quantile(finite, [tail, 1 - tail])
    return float(low), float(high)


def per_question_scores(scores: ArrayLike) -> np.ndarray:
    """Per-question accuracy in [0, 1]: a 1-D array as is, or the row means of a
    (questions x repeats) array, so a question's repeats always move together."""
    values = np.asarray(scores, dtype=float)
    if values.ndim == 2:
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row is reported below
            values = np.nanmean(values, axis=1)
    if values.ndim != 1:
        raise ValueError(f"scores must be per question (1-D) or questions x repeats (2-D), got shape {values.shape}")
    if np.isnan(values).any():
        raise ValueError("every question needs at least one scored repeat")
    if np.any((values < 0) | (values > 1)):
        raise ValueError("per-question scores must lie in [0, 1]")
    return values


def compare_paired(
    arm: ArrayLike,
    reference: ArrayLike,
    oracle: ArrayLike | None = None,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: np.ndarray | None = None,
    seed: int = 0,
) -> PairedComparison:
    """`arm` against `reference` (and APGR against `oracle`) on the same questions, aligned by index.

    Each input holds one question per row: a 0/1 verdict or mean accuracy (1-D), or a
    (questions x repeats) array of verdicts. The difference's interval is a percentile bootstrap
    over questions; McNemar counts a question as solved when strictly more than half of its
    repeats are correct (the majority rule of the warehouse's `outcomes` view). On each resample
    the reference stays the same arm: it was chosen before the evaluation, not on its questions.
    """
    a, r = per_question_scores(arm), per_question_scores(reference)
    o = per_question_scores(oracle) if oracle is not None else None
    if a.shape != r.shape or (o is not None and o.shape != a.shape):
        shapes = [a.shape, r.shape, *([o.shape] if o is not None else [])]
        raise ValueError(f"paired scores must cover the same questions, got shapes {shapes}")
    n = a.size
    if n == 0:
        raise ValueError("no question is shared by the arms being compared")
    draws = question_resamples(n, seed=seed) if resamples is None else resamples
    if draws.shape[1] != n:
        raise ValueError(f"resamples draw {draws.shape[1]} questions, the arms share {n}")
    difference = a - r
    resampled = difference[draws].mean(axis=1)
    low, high = percentile_interval(resampled, confidence)
    arm_solved, reference_solved = a > 0.5, r > 0.5
    arm_only = int(np.sum(arm_solved & ~reference_solved))
    reference_only = int(np.sum(reference_solved & ~arm_solved))
    return PairedComparison(
        n_questions=n,
        arm_accuracy=float(a.mean()),
        reference_accuracy=float(r.mean()),
        difference=Estimate(float(difference.mean()), low, high),
        arm_only=arm_only,
        reference_only=reference_only,
        mcnemar_p=mcnemar_exact_p(arm_only, reference_only),
        headroom_recovered=_headroom_recovered(a, r, o, draws, confidence) if o is not None else None,
        p_value=bootstrap_p_value(resampled),
        confidence=confidence,
    )


def _headroom_recovered(
    arm: np.ndarray, reference: np.ndarray, oracle: np.ndarray, draws: np.ndarray, confidence: float
) -> Estimate | None:
    """APGR and its bootstrap interval; resamples where the oracle has no headroom are left out."""
    headroom = oracle.mean() - reference.mean()
    if headroom <= 0:
        return None
    gain = (arm - reference)[draws].mean(axis=1)
    room = (oracle - reference)[draws].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = np.where(room > 0, gain / room, np.nan)
    low, high = percentile_interval(shares, confidence)
    return Estimate(float((arm.mean() - reference.mean()) / headroom), low, high)
