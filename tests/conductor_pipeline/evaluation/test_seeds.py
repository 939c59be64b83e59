"""Verdicts pooled over seeds, on data with a known answer: a seed that trained a good conductor is
one draw of the recipe, not evidence for it on every question; Holm's correction decides a verdict
that a single test would call; arms a seed did not evaluate stay out of that seed's cells."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from conductor_pipeline.evaluation.seeds import (
    POOLED_TEST,
    SeedScores,
    accuracy_spread,
    pooled_comparisons,
    pooled_markdown,
    pooled_pairs,
    two_way_bootstrap,
)
from conductor_pipeline.stats import bootstrap_p_value, compare_paired, holm_adjusted

N = 384


def seed_run(seed: int, arms: dict[str, np.ndarray], questions: list[str] | None = None) -> SeedScores:
    ids = questions or [f"q{i:03d}" for i in range(N)]
    rows = [{"arm": arm, "question_id": q, "score": float(v)} for arm, values in arms.items() for q, v in zip(ids, values)]
    return SeedScores(seed, pl.DataFrame(rows))


def verdicts(rng: np.random.Generator, p: float = 0.45) -> np.ndarray:
    return (rng.random(N) < p).astype(float)


def with_gain(reference: np.ndarray, questions: int, losses: int = 0) -> np.ndarray:
    """`reference` with `questions` of its failures turned into successes (and `losses` of its
    successes into failures)."""
    arm = reference.copy()
    arm[np.flatnonzero(reference == 0)[:questions]] = 1.0
    arm[np.flatnonzero(reference == 1)[:losses]] = 0.0
    return arm


def test_a_constant_difference_has_a_point_interval() -> None:
    draws = two_way_bootstrap(np.full((3, 50), 0.25), n_resamples=200)
    assert np.allclose(draws, 0.25)
    assert bootstrap_p_value(draws) < 0.01


def test_the_two_way_bootstrap_carries_a_seed_effect_that_resampling_questions_alone_hides() -> None:
    """Three seeds on the same questions: one trained a conductor 12 points better, two tie. Pooling
    the rows as if they were 3 x 384 independent questions calls it a clear win; resampling whole
    seeds says one seed in three is not enough to say so."""
    rng = np.random.default_rng(0)
    reference = verdicts(rng)
    rows_arm = [with_gain(reference, 46), reference.copy(), reference.copy()]
    differences = np.vstack(rows_arm) - reference
    two_way = two_way_bootstrap(differences)
    flat = compare_paired(np.concatenate(rows_arm), np.tile(reference, 3))
    two_way_low = np.quantile(two_way, 0.025)
    assert flat.verdict == "beats"
    assert two_way_low <= 0 < flat.difference.low
    assert bootstrap_p_value(two_way) > 0.05


def test_a_gain_every_seed_shows_is_a_pooled_win_and_each_seed_keeps_its_own_verdict() -> None:
    rng = np.random.default_rng(1)
    runs = []
    for seed, (gains, losses) in ((0, (30, 0)), (1, (36, 0)), (2, (18, 12))):
        reference = verdicts(rng)
        runs.append(seed_run(seed, {"trained": with_gain(reference, gains, losses), "best_single": reference}))
    [pooled] = pooled_comparisons(runs, [("trained", "best_single")])
    assert pooled.seeds == (0, 1, 2) and pooled.n_questions == N
    assert pooled.difference.value == pytest.approx((30 + 36 + 6) / (3 * N))
    assert pooled.verdict == "beats" and pooled.p_holm == pooled.p_value  # one comparison: nothing to adjust
    assert pooled.per_seed_verdict == {0: "beats", 1: "beats", 2: "ties"}
    assert pooled.per_seed[1].value == pytest.approx(36 / N)


def test_holm_decides_the_verdict_of_a_family() -> None:
    """A comparison whose own p is under 0.05 ties once three others share its reference."""
    assert holm_adjusted([0.04, 0.5, 0.6, 0.7]) == pytest.approx([0.16, 1.0, 1.0, 1.0])
    rng = np.random.default_rng(3)
    reference = verdicts(rng)
    # One seed, so the pooled test is a bootstrap over questions: +3.1 points on 384 questions.
    marginal = with_gain(reference, 20, losses=8)
    run = seed_run(0, {"arm": marginal, "reference": reference, "other": reference, "third": reference,
                       "fourth": reference})
    [alone] = pooled_comparisons([run], [("arm", "reference")])
    family = pooled_comparisons([run], [("arm", "reference"), ("arm", "other"), ("arm", "third"), ("arm", "fourth")])
    assert 0.0125 < alone.p_value < 0.05 and alone.verdict == "beats"
    assert family[0].p_value == alone.p_value and family[0].p_holm > 0.05
    assert [c.verdict for c in family] == ["ties"] * 4
    assert family[0].per_seed_verdict == {0: "ties"}, "a seed's own verdict is Holm-adjusted over the same pairs"


def test_seeds_pool_only_the_arms_they_evaluated_and_the_questions_all_of_them_share() -> None:
    rng = np.random.default_rng(4)
    reference = verdicts(rng)
    full = seed_run(0, {"trained": with_gain(reference, 20), "random": reference})
    gated = seed_run(1, {"random": reference})  # its gate closed: no trained arm
    short_ids = [f"q{i:03d}" for i in range(N)][: N - 84]
    short = seed_run(2, {"trained": with_gain(reference, 20)[: N - 84], "random": reference[: N - 84]}, short_ids)
    [pooled] = pooled_comparisons([full, gated, short], [("trained", "random"), ("trained", "missing")])
    assert pooled.seeds == (0, 2) and pooled.n_questions == N - 84


def test_the_pooled_table_names_its_test_and_every_seed() -> None:
    rng = np.random.default_rng(5)
    runs = [seed_run(s, {"trained": with_gain(r, 10), "random": r}) for s, r in ((0, verdicts(rng)), (7, verdicts(rng)))]
    text = pooled_markdown(pooled_comparisons(runs, [("trained", "random")]))
    assert POOLED_TEST in text and "0: +2.6" in text and "7: +2.6" in text
    assert pooled_markdown([]).startswith("No trained arm")


def test_the_pairs_are_the_trained_arms_references_and_the_reordered_twin() -> None:
    pairs_of_a_seed = [
        ("conductor:hf:checkpoint-120", "best_single"), ("conductor:hf:checkpoint-120", "random"),
        ("conductor:hf:warm_start", "best_single"),
        ("conductor:hf:checkpoint-120@shuffled", "best_single"),
        ("conductor:hf:checkpoint-120@shuffled", "conductor:hf:checkpoint-120"),
    ]
    chosen = pooled_pairs([pairs_of_a_seed, pairs_of_a_seed[:2]], ["conductor:hf:checkpoint-120"])
    assert chosen == [
        ("conductor:hf:checkpoint-120", "best_single"), ("conductor:hf:checkpoint-120", "random"),
        ("conductor:hf:checkpoint-120@shuffled", "conductor:hf:checkpoint-120"),
    ]


def test_the_spread_is_over_seeds() -> None:
    assert accuracy_spread({0: 0.464, 1: 0.451, 2: 0.484}) == pytest.approx(
        {"mean": 0.4663333, "min": 0.451, "max": 0.484, "std": 0.0166233}, rel=1e-5
    )
    with pytest.raises(ValueError, match="no seed"):
        accuracy_spread({})
