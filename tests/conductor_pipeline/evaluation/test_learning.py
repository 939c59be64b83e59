"""Telling routing from format and position: paired references, positions, order agreement, balance."""

from __future__ import annotations

import polars as pl
import pytest

from conductor_pipeline.evaluation.learning import (
    choice_balance,
    conductor_comparisons,
    conductor_references,
    order_agreement,
    steps_by_position,
)

POOL_ORDER = ["a", "b", "c"]


def _rows(arm: str, picks: dict[str, list[str]], catalogue=None, correct=None) -> list[dict]:
    return [
        {"arm": arm, "question_id": q, "repeat": 0, "parse_code": "ok", "infra_failure": False, "workers": workers,
         "catalogue": (catalogue or {}).get(q, POOL_ORDER), "correct": (correct or {}).get(q, True)}
        for q, workers in picks.items()
    ]


def test_a_positional_policy_agrees_with_itself_only_where_the_shuffle_kept_its_favourite_position():
    shuffled = {"q1": ["c", "a", "b"], "q2": ["b", "c", "a"], "q3": ["a", "b", "c"]}
    # Always the worker listed first: "a" in pool order, whatever comes first when shuffled.
    frame = pl.DataFrame(
        _rows("conductor:p", {q: ["a"] for q in shuffled})
        + _rows("conductor:p@shuffled", {q: [order[0]] for q, order in shuffled.items()}, catalogue=shuffled),
    )
    agreement = order_agreement(frame, {"conductor:p": "conductor:p@shuffled"}).row(0, named=True)
    assert agreement["both_parsed"] == 3 and agreement["same_final_worker"] == pytest.approx(1 / 3)
    positions = steps_by_position(frame)
    assert positions.filter(pl.col("arm") == "conductor:p@shuffled")["position"].to_list() == [0]


def test_every_conductor_is_held_against_its_warm_start_random_and_the_vote():
    arms = ["best_single", "random", "vote:top5", "conductor:warm", "conductor:trained", "conductor:trained@shuffled"]
    references = conductor_references(
        "conductor:trained@shuffled", arms, started_from={"conductor:trained@shuffled": "conductor:warm"},
        order_twins={"conductor:trained": "conductor:trained@shuffled"},
    )
    assert [r for r, _ in references] == ["best_single", "random", "conductor:warm", "vote:top5", "conductor:trained"]
    questions = {f"q{i}": ["a"] for i in range(20)}
    right = {q: i % 2 == 0 for i, q in enumerate(questions)}
    frame = pl.DataFrame(
        _rows("conductor:trained", questions) + _rows("random", questions, correct=right)
        + _rows("best_single", questions, correct=right)
    )
    pairs = conductor_comparisons(frame, ["conductor:trained"], started_from={}, order_twins={})
    assert pairs["reference"].to_list() == ["best_single", "random"]
    assert pairs["difference"].to_list() == [0.5, 0.5] and set(pairs["verdict"]) == {"beats"}


def test_choice_balance_tells_uniform_picks_from_a_position_prior():
    catalogues = [POOL_ORDER[i:] + POOL_ORDER[:i] for i in range(3)] * 40
    uniform = pl.DataFrame([
        {"parse_code": "ok", "workers": [catalogue[n % 3]], "catalogue": catalogue}
        for n, catalogue in enumerate(catalogues)
    ])
    first = pl.DataFrame([{"parse_code": "ok", "workers": [c[0]], "catalogue": c} for c in catalogues])
    assert choice_balance(uniform)["by_position"]["p_value"] > 0.5
    positional = choice_balance(first)
    assert positional["by_position"]["p_value"] < 1e-6 and positional["by_position"]["observed"]["0"] == 120
    assert positional["by_worker"]["p_value"] > 0.5  # the catalogues rotate: first place visits every worker
