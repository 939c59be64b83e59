"""The pool search on synthetic outcomes whose answer is known: a planted specialist pair it must
find, a correlated pair it must not rank first, exact headroom figures, null pools and costs."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import polars as pl
import pytest

from conductor_pipeline.probing.ceilings import oracle_ceiling
from conductor_pipeline.probing.pool_search import (
    ALL_CANDIDATES,
    PoolSearchError,
    PoolSearchSettings,
    beam_search,
    search_pools,
    sub_pool_figures,
)
from conductor_pipeline.probing.pool_search_report import (
    search_table_markdown,
    subject_tables_markdown,
    subject_winners,
)
from conductor_pipeline.probing.recorded_outcomes import SAMPLE_OUTCOME_SCHEMA

N_QUESTIONS = 400  # 200 per subject; question i is on the eval side when i is odd
SETTINGS = PoolSearchSettings(n_bootstrap=200)


def odd_is_eval(question_id: str) -> str:
    return "eval" if int(question_id[1:]) % 2 else "train"


def _pattern(i: int) -> tuple[str, int]:
    """(subject, j): the subject alternates in pairs and j = i // 2, so both sides of the split see
    every subject and every residue of j equally often."""
    return ("Geometry" if (i // 2) % 2 == 0 else "Algebra"), i // 4


# worker -> correct(subject, j). Specialists: each right on 90% of its subject and 10% of the other,
# on complementary questions, so together they solve everything. Generalists: identical answers.
WORKERS = {
    "spec-geometry": lambda subject, j: (j % 10 != 0) if subject == "Geometry" else (j % 10 == 0),
    "spec-algebra": lambda subject, j: (j % 10 != 0) if subject == "Algebra" else (j % 10 == 0),
    "gen-a": lambda subject, j: j % 10 < 7,
    "gen-b": lambda subject, j: j % 10 < 7,
    "gen-c": lambda subject, j: j % 10 < 8,
    "weak": lambda subject, j: j % 10 == 1,
}


def questions_frame(n: int = N_QUESTIONS) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "question_id": [f"q{i:04d}" for i in range(n)],
            "corpus": ["math"] * n,
            "split": ["test"] * n,
            "subject": [_pattern(i)[0] for i in range(n)],
            "level": [5] * n,
        }
    )


def outcomes_frame(workers=WORKERS, n: int = N_QUESTIONS, cost: float | None = 0.001) -> pl.DataFrame:
    rows = []
    for i in range(n):
        subject, j = _pattern(i)
        for worker, correct in workers.items():
            rows.append((f"q{i:04d}", worker, 0, bool(correct(subject, j)), cost, True))
    return pl.DataFrame(rows, schema=SAMPLE_OUTCOME_SCHEMA, orient="row")


@pytest.fixture(scope="module")
def report():
    return search_pools(
        outcomes_frame(), questions_frame(), SETTINGS, reference_pools={"generalists": ["gen-a", "gen-b"]},
        split_fn=odd_is_eval,
    )


def test_the_planted_specialist_pair_is_found_and_its_headroom_holds_out_of_sample(report) -> None:
    best2 = next(r for r in report.searched if r.size == 2)
    assert best2.members == ("spec-algebra", "spec-geometry")
    # Together they solve everything; each alone solves half: headroom 0.5 on both sides.
    for figures in (best2.train, best2.eval):
        assert (figures.oracle, figures.best_single, figures.headroom) == pytest.approx((1.0, 0.5, 0.5))
    assert best2.eval_headroom_interval[0] > 0.4 and best2.holds_out_of_sample
    # Both specialists stay in every larger winner.
    assert all({"spec-algebra", "spec-geometry"} <= set(r.members) for r in report.searched)
    assert [r.size for r in report.searched] == [2, 3, 4, 5, 6]
    # Their outcomes are anti-correlated; the subject table shows each winning its own subject.
    assert best2.error_correlation < -0.5
    assert subject_winners(best2.subject_table, best2.members) == [["spec-algebra"], ["spec-geometry"]]
    assert "2 different members win a subject outright" in subject_tables_markdown(report)


def test_the_correlated_pair_is_not_ranked_first_and_shows_no_headroom(report) -> None:
    generalists = next(r for r in report.results if r.label == "generalists")
    assert generalists.kind == "reference"
    assert generalists.train.headroom == 0 and generalists.eval.headroom == 0
    assert generalists.eval_headroom_interval == (0.0, 0.0)
    assert generalists.error_correlation == pytest.approx(1.0)
    ranked = beam_search(
        outcomes_frame().pivot(on="worker", index="question_id", values="correct").drop("question_id")
        .cast(pl.Float64).to_numpy(), list(WORKERS), min_size=2, max_size=2, beam_width=100,
    )[2]
    names = list(WORKERS)
    assert {names[i] for i in ranked[0]} == {"spec-algebra", "spec-geometry"}
    generalist_rank = [tuple(sorted(names[i] for i in m)) for m in ranked].index(("gen-a", "gen-b"))
    assert generalist_rank > 0


def test_reported_figures_equal_the_oracle_ceiling_sql(report) -> None:
    outcomes = outcomes_frame().select("question_id", "worker", "correct")
    eval_ids = [q for q in questions_frame()["question_id"] if odd_is_eval(q) == "eval"]
    for result in report.results:
        sql = oracle_ceiling(outcomes.filter(pl.col("question_id").is_in(eval_ids)), result.members)
        assert sql["n_questions"] == report.n_eval
        assert (result.eval.oracle, result.eval.best_single, result.eval.best_worker) == (
            pytest.approx(sql["oracle"]), pytest.approx(sql["best_single"]), sql["best_worker"],
        )


def test_the_beam_finds_the_exhaustive_optimum_and_greedy_never_beats_it() -> None:
    rng = np.random.default_rng(5)
    correct = (rng.random((300, 9)) < rng.uniform(0.3, 0.9, 9)).astype(float)
    names = [f"w{i}" for i in range(9)]
    wide = beam_search(correct, names, min_size=2, max_size=4, beam_width=200)
    greedy = beam_search(correct, names, min_size=2, max_size=4, beam_width=1)
    for size in (2, 3, 4):
        best = max(sub_pool_figures(correct, names, m).headroom for m in combinations(range(9), size))
        assert sub_pool_figures(correct, names, wide[size][0]).headroom == pytest.approx(best)
        assert sub_pool_figures(correct, names, greedy[size][0]).headroom <= best + 1e-12


def test_costs_samples_and_the_single_sample_note(report) -> None:
    best3 = next(r for r in report.searched if r.size == 3)
    assert best3.cost_all_members == pytest.approx(0.003) and best3.cost_best_single == pytest.approx(0.001)
    assert best3.samples_per_question == 1 and best3.null_headroom is None
    markdown = search_table_markdown(report)
    assert "no null pool can be shown" in markdown and "sampling noise" in markdown
    assert "(est.)" in markdown
    assert report.search_seconds >= 0 and report.n_train == report.n_eval == N_QUESTIONS // 2
    everyone = next(r for r in report.results if r.label.startswith(ALL_CANDIDATES))
    assert everyone.size == len(WORKERS) and report.strongest_candidate == ("gen-c", pytest.approx(0.8))
    table = report.table()
    assert table.height == len(report.results) and {"eval_headroom_low", "null_headroom"} <= set(table.columns)


def test_a_multi_sample_worker_gets_a_null_pool_with_a_known_headroom() -> None:
    # "multi" has 4 samples per question; sample s fails exactly when (j + s) % 4 == 0, so each
    # sample is right on 3/4 of the questions and two samples together on all: null headroom 0.25.
    rows = []
    for i in range(N_QUESTIONS):
        subject, j = _pattern(i)
        for s in range(4):
            rows.append((f"q{i:04d}", "multi", s, (j + s) % 4 != 0, None, False))
        rows.append((f"q{i:04d}", "other", 0, j % 2 == 0, None, False))
    outcomes = pl.DataFrame(rows, schema=SAMPLE_OUTCOME_SCHEMA, orient="row")
    result = search_pools(outcomes, questions_frame(), SETTINGS.model_copy(update={"max_size": 2}),
                          split_fn=odd_is_eval).searched[0]
    assert result.samples_per_question == 4
    assert (result.null_headroom, result.null_samples) == (pytest.approx(0.25), 2)
    assert result.cost_all_members is None  # no cost recorded


def test_coverage_excludes_sparse_workers_and_scores_only_complete_questions() -> None:
    outcomes = outcomes_frame()
    sparse = outcomes_frame({"sparse": lambda s, j: True}, n=100)
    gappy = outcomes.filter(~((pl.col("worker") == "gen-c") & (pl.col("question_id") == "q0003")))
    result = search_pools(pl.concat([gappy, sparse]), questions_frame(), SETTINGS, split_fn=odd_is_eval)
    assert result.excluded == {"sparse": pytest.approx(0.25)}
    assert "sparse (25%)" in search_table_markdown(result)
    assert result.n_train + result.n_eval == N_QUESTIONS - 1  # q0003 lacks gen-c's outcome


def test_too_few_candidates_or_an_empty_side_fail_with_a_reason() -> None:
    one = outcomes_frame({"alone": lambda s, j: True})
    with pytest.raises(PoolSearchError, match="needs two"):
        search_pools(one, questions_frame(), SETTINGS, split_fn=odd_is_eval)
    with pytest.raises(PoolSearchError, match="eval-split"):
        search_pools(outcomes_frame(), questions_frame(), SETTINGS, split_fn=lambda q: "train")
    with pytest.raises(PoolSearchError, match="min_worker_accuracy"):
        search_pools(outcomes_frame(), questions_frame(), SETTINGS.model_copy(update={"min_worker_accuracy": 0.79}),
                     split_fn=odd_is_eval)
