"""Paired comparisons on data with a known answer: a planted difference is found, an identical or
equally good arm is not, McNemar matches the binomial by hand, APGR and repeats behave."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from conductor_pipeline.stats import (
    Estimate,
    compare_paired,
    holm_adjusted,
    mcnemar_exact_p,
    per_question_scores,
    question_resample_counts,
    question_resamples,
)

N = 400


def reference_verdicts(seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random(N) < 0.5).astype(float)


def test_a_planted_difference_is_found_and_its_interval_excludes_zero():
    reference = reference_verdicts()
    arm = reference.copy()
    arm[np.flatnonzero(reference == 0)[:40]] = 1.0  # 40 questions only the arm solves: +10 points
    result = compare_paired(arm, reference)
    assert result.difference.value == pytest.approx(40 / N)
    assert 0 < result.difference.low < 40 / N < result.difference.high
    assert (result.arm_only, result.reference_only) == (40, 0)
    assert result.mcnemar_p == pytest.approx(2 * 0.5**40)
    assert result.verdict == "beats"
    assert compare_paired(reference, arm).verdict == "loses"


def test_an_identical_pair_ties_with_zero_difference():
    reference = reference_verdicts()
    result = compare_paired(reference, reference)
    assert result.difference == Estimate(0.0, 0.0, 0.0)
    assert result.difference.low <= 0 <= result.difference.high
    assert (result.arm_only, result.reference_only, result.mcnemar_p) == (0, 0, 1.0)
    assert result.verdict == "ties"


def test_an_equally_good_arm_ties_and_the_interval_covers_zero_about_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    excluded = 0
    for _ in range(200):
        a, b = (rng.random(200) < 0.5).astype(float), (rng.random(200) < 0.5).astype(float)
        excluded += compare_paired(a, b, resamples=question_resamples(200, 500, seed=1)).difference.excludes_zero()
    assert 2 <= excluded <= 20  # 5% of 200 is 10


def test_mcnemar_is_the_exact_binomial_on_the_discordant_questions():
    assert mcnemar_exact_p(0, 10) == pytest.approx(2 / 1024)
    assert mcnemar_exact_p(1, 9) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact_p(5, 5) == pytest.approx(1.0)
    assert mcnemar_exact_p(0, 0) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact_p(-1, 3)


def test_apgr_is_the_share_of_the_oracle_headroom_with_an_interval():
    reference = np.array([1.0] * 50 + [0.0] * 50)
    oracle = np.array([1.0] * 80 + [0.0] * 20)  # 30 points of headroom
    arm = np.array([1.0] * 65 + [0.0] * 35)  # recovers 15 of them
    result = compare_paired(arm, reference, oracle)
    assert result.headroom_recovered.value == pytest.approx(0.5)
    assert result.headroom_recovered.low < 0.5 < result.headroom_recovered.high
    assert compare_paired(arm, reference, reference).headroom_recovered is None  # no headroom, no share


def test_repeats_move_together_and_mcnemar_reads_the_majority_of_repeats():
    repeats = np.array([[1, 1], [1, 0], [0, 0], [1, 1]], dtype=float)
    assert per_question_scores(repeats).tolist() == [1.0, 0.5, 0.0, 1.0]
    reference = np.array([0.0, 1.0, 0.0, 1.0])
    draws = question_resamples(4, 300, seed=3)
    as_matrix = compare_paired(repeats, reference, resamples=draws)
    as_means = compare_paired(per_question_scores(repeats), reference, resamples=draws)
    assert as_matrix == as_means
    # q0: only the arm; q1: the arm's 1 of 2 repeats is no majority, so only the reference.
    assert (as_matrix.arm_only, as_matrix.reference_only) == (1, 1)


def test_inputs_that_do_not_pair_are_refused():
    with pytest.raises(ValueError, match="same questions"):
        compare_paired([1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match="no question"):
        compare_paired([], [])
    with pytest.raises(ValueError, match="scored repeat"):
        per_question_scores(np.array([[np.nan, np.nan], [1.0, 0.0]]))


def test_resample_counts_are_the_index_draws_counted() -> None:
    draws = question_resamples(7, 50, seed=3)
    counts = question_resample_counts(7, 50, seed=3)
    assert counts.shape == (50, 7)
    assert (counts.sum(axis=1) == 7).all()
    for row, drawn in zip(counts, draws, strict=True):
        assert (row == np.bincount(drawn, minlength=7)).all()


@pytest.mark.parametrize("seed", range(20))
def test_holm_is_statsmodels_holm_in_the_order_given(seed: int) -> None:
    """The project's Holm against statsmodels' (kept out of the product: it runs gc.collect() on
    every call), on families of 1 to 30 p-values with ties, zeros, ones and values that cap at 1."""
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 31))
    p_values = rng.choice([0.0, 1.0, 0.01, 0.04, 0.5, *rng.random(5)], size=size).tolist()
    gc.freeze()  # its gc.collect() would walk every object the test worker holds (0.5-1 s a call)
    try:
        expected = list(multipletests(p_values, method="holm")[1])
    finally:
        gc.unfreeze()
    assert holm_adjusted(p_values) == pytest.approx(expected, abs=1e-12)


def test_holm_of_no_p_values_is_empty() -> None:
    assert holm_adjusted([]) == []
