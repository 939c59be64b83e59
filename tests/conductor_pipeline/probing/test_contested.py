"""Contested-set selection: what is kept, what is dropped, and what one sample would have got wrong."""

from __future__ import annotations

import polars as pl
import pytest

from conductor_pipeline.probing.contested import ContestedRule, pass_rate_histogram, routing_anchors, select_contested


def rates(rows: list[tuple[str, str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["question_id", "worker", "samples", "successes"], orient="row")


POOL = rates(
    [
        # q_easy: everyone always right -> zero reward variance, dropped
        ("q_easy", "weak", 6, 6), ("q_easy", "mid", 6, 6), ("q_easy", "strong", 6, 6),
        # q_hard: nobody ever right -> dropped
        ("q_hard", "weak", 6, 0), ("q_hard", "mid", 6, 0), ("q_hard", "strong", 6, 0),
        # q_sep: weak 0/6 vs strong 6/6: intervals separate
        ("q_sep", "weak", 6, 0), ("q_sep", "mid", 6, 3), ("q_sep", "strong", 6, 6),
        # q_band: weak and strong both 3/6 but mid 0/6 vs... band needs <=0.25 and >=0.75
        ("q_band", "weak", 6, 5), ("q_band", "mid", 6, 1), ("q_band", "strong", 6, 3),
        # q_mild: everyone between 0.33 and 0.67: mixed, but no routing decision with confidence
        ("q_mild", "weak", 6, 2), ("q_mild", "mid", 6, 3), ("q_mild", "strong", 6, 4),
        # extra questions so the marginal ranking is weak < mid < strong
        ("q_x", "weak", 6, 1), ("q_x", "mid", 6, 4), ("q_x", "strong", 6, 6),
    ]
)


def test_contested_keeps_decisions_and_drops_zero_variance():
    selection = select_contested(POOL)
    assert (selection.weak, selection.strong) == ("weak", "strong")
    assert selection.question_ids == ["q_band", "q_sep", "q_x"]
    reasons = dict(zip(selection.questions["question_id"], selection.questions["reason"]))
    assert reasons["q_sep"] == "separated+band"
    assert reasons["q_band"] == "band"
    assert selection.counts["all_solve"] == 1 and selection.counts["none_solve"] == 1
    assert selection.counts["mixed_not_contested"] == 1  # q_mild


def test_explicit_weak_strong_and_unknown_worker():
    selection = select_contested(POOL, ContestedRule(weak="mid", strong="strong", band_low=0.0, band_high=1.0))
    # band 0..1 needs a 0.0 and a 1.0 rate; q_sep has both, q_x has weak=1/6 so mid 4/6 vs strong 6/6 don't separate
    assert selection.question_ids == ["q_sep"]
    with pytest.raises(ValueError, match="nobody"):
        select_contested(POOL, ContestedRule(weak="nobody"))


def test_only_questions_every_worker_covers_count():
    partial = pl.concat([POOL, rates([("q_only_weak", "weak", 6, 0)])])
    assert "q_only_weak" not in select_contested(partial).question_ids


def test_one_sample_flips_show_the_coin_flip():
    # With one sample each, q_mild looked "too easy" (every worker's first sample was right).
    first = pl.DataFrame(
        {
            "question_id": ["q_mild"] * 3 + ["q_easy"] * 3,
            "worker": ["weak", "mid", "strong"] * 2,
            "correct": [True, True, True, True, True, True],
        }
    )
    flips = select_contested(POOL, first_samples=first).one_sample_flips
    assert flips["one_sample_too_easy"] == 2
    assert flips["one_sample_too_easy_but_mixed"] == 1
    assert flips["all_solve->all_solve"] == 1 and flips["flipped"] == 1


def test_single_sample_pools_report_no_flip_statistics():
    single = rates([("a", "w1", 1, 1), ("a", "w2", 1, 0), ("b", "w1", 1, 1), ("b", "w2", 1, 1)])
    selection = select_contested(single, first_samples=single.select("question_id", "worker").with_columns(correct=True))
    assert selection.one_sample_flips is None
    assert selection.question_ids == ["a"]  # 1 vs 0 straddles the band; intervals of n=1 never separate


def test_histogram_counts_every_question():
    hist = pass_rate_histogram(POOL)
    assert hist["questions"].sum() == POOL["question_id"].n_unique()


def test_empty_pass_rates_are_refused():
    with pytest.raises(ValueError, match="probe the pool"):
        select_contested(rates([]))


def test_routing_anchors_name_each_questions_best_and_worst_workers():
    anchors = routing_anchors(POOL)
    assert "q_easy" not in anchors and "q_hard" not in anchors  # no spread: nothing to keep
    for qid, (best, worst) in anchors.items():
        frame = POOL.filter(pl.col("question_id") == qid).with_columns(rate=pl.col("successes") / pl.col("samples"))
        top, bottom = frame["rate"].max(), frame["rate"].min()
        assert set(best) == set(frame.filter(pl.col("rate") == top)["worker"])
        assert set(worst) == set(frame.filter(pl.col("rate") == bottom)["worker"])


def test_pass_rates_from_the_warehouse_keep_fractions(tmp_path):
    """k-sample pass rates read back from DuckDB stay fractions (3 of 6 is 0.5, not truncated to 0)."""
    from conductor_pipeline.probing.pass_rates import pass_rate_table
    from conductor_pipeline.warehouse import Warehouse
    from tests.builders import make_call

    store = Warehouse(tmp_path / "w.duckdb")
    rows = []
    for worker, wins in (("weak", 0), ("mid", 3), ("strong", 6)):
        for sample in range(6):
            call = make_call(sample, worker=worker, correct=sample < wins)
            call.call_id, call.question_id, call.pool = f"{worker}-{sample}", "q", "p"
            rows.append(call)
    store.insert("calls", rows)
    table = pass_rate_table(store, "p")
    assert table.schema["successes"] == pl.Int64
    selection = select_contested(table)
    assert selection.questions.row(0, named=True)["max_rate"] == 1.0
    assert dict(zip(table["worker"], table["pass_rate"])) == {"mid": 0.5, "strong": 1.0, "weak": 0.0}
