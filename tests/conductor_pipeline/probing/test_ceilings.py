"""sql/oracle_ceiling.sql on hand-made outcomes, the sub-pool search, the null pool, the intervals."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import polars as pl
import pytest
from scipy.stats import beta, binomtest

from conductor_pipeline.probing.ceilings import best_subpools, ceiling_table, null_pool_table, oracle_ceiling
from conductor_pipeline.stats import wilson_interval


def jeffreys_interval(successes: np.ndarray, trials: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """95% Jeffreys interval: equal-tailed Beta(s+1/2, n-s+1/2) quantiles, ends pinned at 0/n and n/n
    (a second binomial interval to hold Wilson's against; the pipeline uses Wilson's only)."""
    s, n = np.broadcast_arrays(np.asarray(successes, dtype=float), np.asarray(trials, dtype=float))
    lower = beta.ppf(0.025, s + 0.5, n - s + 0.5)
    upper = beta.ppf(0.975, s + 0.5, n - s + 0.5)
    return np.where(s == 0, 0.0, lower), np.where(s == n, 1.0, upper)


def outcomes(table: dict[str, dict[str, bool | None]]) -> pl.DataFrame:
    """{worker: {question: correct}} -> outcomes(question_id, worker, correct)."""
    rows = [(q, w, c) for w, answers in table.items() for q, c in answers.items()]
    return pl.DataFrame(rows, schema={"question_id": pl.String, "worker": pl.String, "correct": pl.Boolean}, orient="row")


def test_ties_go_to_the_smallest_name() -> None:
    result = oracle_ceiling(outcomes({
        "zeta": {"q1": True, "q2": False, "q3": True, "q4": False},
        "alpha": {"q1": False, "q2": True, "q3": True, "q4": False},
        "mid": {"q1": False, "q2": False, "q3": True, "q4": False},
    }))
    assert result == {
        "n_questions": 4, "best_worker": "alpha", "best_single": 0.5, "oracle": 0.75, "headroom": 0.25, "unsolved": 1,
    }


def test_only_questions_every_worker_answered_count() -> None:
    result = oracle_ceiling(outcomes({
        "a": {"q1": True, "q2": False, "q3": False, "q4": True},
        "b": {"q1": False, "q2": True, "q3": None},  # q3 unscored, q4 missing: both drop out
    }))
    assert result["n_questions"] == 2
    assert (result["best_worker"], result["best_single"], result["oracle"], result["unsolved"]) == ("a", 0.5, 1.0, 0)


def test_all_solved_and_none_solved() -> None:
    solved = oracle_ceiling(outcomes({"a": {"q1": True, "q2": True}, "b": {"q1": True, "q2": False}}))
    assert (solved["oracle"], solved["best_single"], solved["headroom"], solved["unsolved"]) == (1.0, 1.0, 0.0, 0)
    none = oracle_ceiling(outcomes({"a": {"q1": False, "q2": False}, "b": {"q1": False, "q2": False}}))
    assert (none["n_questions"], none["best_worker"], none["oracle"], none["headroom"], none["unsolved"]) == (
        2, "a", 0.0, 0.0, 2,
    )


def test_filtering_to_a_sub_pool_changes_the_coverage() -> None:
    frame = outcomes({"a": {"q1": True, "q2": False}, "b": {"q1": False}, "c": {"q1": False, "q2": True}})
    assert oracle_ceiling(frame)["n_questions"] == 1
    assert oracle_ceiling(frame, ["a", "c"]) | {} == {
        "n_questions": 2, "best_worker": "a", "best_single": 0.5, "oracle": 1.0, "headroom": 0.5, "unsolved": 0,
    }


def test_subpool_search_agrees_with_the_sql_on_every_combination() -> None:
    rng = np.random.default_rng(7)
    workers = [f"w{i}" for i in range(6)]
    skill = rng.uniform(0.2, 0.8, size=len(workers))
    table = {
        w: {f"q{q}": (None if rng.random() < 0.05 else bool(rng.random() < skill[i])) for q in range(80)}
        for i, w in enumerate(workers)
    }
    frame = outcomes(table)
    best = best_subpools(frame, workers, max_size=3)
    for size in (1, 2, 3):
        by_sql = {c: oracle_ceiling(frame, c) for c in combinations(sorted(workers), size)}
        top = max(by_sql.values(), key=lambda r: (r["oracle"], r["n_questions"]))
        assert by_sql[best[size]]["oracle"] == pytest.approx(top["oracle"])
    table_frame = ceiling_table(frame, workers)
    assert table_frame["kind"].to_list() == ["pool"] + ["leave_one_out"] * 6 + ["best_subpool"] * 3
    assert table_frame.filter(pl.col("row") == "without w0")["workers"][0] == "w1, w2, w3, w4, w5"


def test_null_pool_shows_headroom_from_resampling_one_model() -> None:
    rng = np.random.default_rng(0)
    # One model, 200 questions each solved with probability 0.5 per sample, 6 samples.
    rows = [(f"q{q}", "solo", s, bool(rng.random() < 0.5)) for q in range(200) for s in range(6)]
    rows += [(f"q{q}", "single-shot", 0, True) for q in range(200)]  # one sample: no null pool for it
    samples = pl.DataFrame(rows, schema=["question_id", "worker", "sample", "correct"], orient="row")
    table = null_pool_table(samples, pool_size=6)
    assert table["row"].to_list() == ["null: 2 samples of solo", "null: 3 samples of solo", "null: 6 samples of solo"]
    three = table.row(1, named=True)
    assert three["best_single"] == pytest.approx(0.5, abs=0.06)
    assert three["oracle"] == pytest.approx(1 - 0.5**3, abs=0.06)  # a "pool" of one model looks like 37 points of headroom
    assert three["headroom"] == pytest.approx(three["oracle"] - three["best_single"])
    assert three["workers"] == "solo#s0, solo#s1, solo#s2" and three["n_questions"] == 200
    single = samples.filter(pl.col("worker") == "single-shot")
    assert null_pool_table(single, pool_size=3).is_empty()


def test_intervals_match_scipy_and_behave_at_the_edges() -> None:
    successes, trials = np.array([0, 3, 6, 17, 0]), np.array([6, 6, 6, 40, 0])
    low, high = wilson_interval(successes, trials)
    for s, n, lo, hi in zip(successes[:4], trials[:4], low, high):
        reference = binomtest(int(s), int(n)).proportion_ci(method="wilson")
        assert (lo, hi) == pytest.approx((reference.low, reference.high))
    assert (low[0], high[2], low[4], high[4]) == (0.0, 1.0, 0.0, 1.0)
    j_low, j_high = jeffreys_interval(successes, trials)
    assert np.all((j_low <= successes / np.maximum(trials, 1)) & (successes / np.maximum(trials, 1) <= j_high))
    assert (j_low[0], j_high[2]) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval([3], [2])
