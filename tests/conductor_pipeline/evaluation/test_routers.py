"""The W-router: fitted on train-split questions only, routes to W's highest score, trades success
for cost with lambda, and its headroom share is computed like RouteLLM's APGR. The W-cascade takes
the cheapest worker W trusts."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from conductor_pipeline.evaluation.frames import routing_value
from conductor_pipeline.evaluation.routers import WCascadeRouter, WorldModelRouter, cascade_choice
from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_of, train_split_rows
from conductor_pipeline.world_model.model import WorldModel, fit_on_train_split
from tests.builders import (
    FAST_WORLD_MODEL,
    SYNTHETIC_WORKERS,
    specialist_skill,
    synthetic_frame,
    synthetic_questions,
    synthetic_seats,
)

QUESTIONS = synthetic_questions(480, seed=1)


@pytest.fixture(scope="module")
def frame() -> pl.DataFrame:
    rows = synthetic_frame(QUESTIONS, specialist_skill, seed=2)
    # A worker outside the pool: its rows must not reach the pool's W.
    stranger = rows.filter(pl.col("worker") == "alpha-7b").with_columns(worker=pl.lit("stranger-1b"))
    return pl.concat([rows, stranger])


@pytest.fixture(scope="module")
def train_w(frame: pl.DataFrame) -> WorldModel:
    return fit_on_train_split(frame, synthetic_seats(), FAST_WORLD_MODEL)


def test_the_routing_w_is_fitted_on_train_split_questions_of_the_pool_only(frame, train_w):
    train_ids = {q.question_id for q in QUESTIONS if split_of(q.question_id) == "train"}
    eval_ids = {q.question_id for q in QUESTIONS} - train_ids
    assert eval_ids and train_ids  # the synthetic set straddles the split
    assert train_w.training_question_ids == frozenset(train_ids)
    assert not train_w.training_question_ids & eval_ids
    assert train_w.training_summary["rows"] == len(train_ids) * len(SYNTHETIC_WORKERS)
    assert train_w.training_summary["workers"] == len(SYNTHETIC_WORKERS)  # the stranger's rows were dropped
    rows = train_split_rows(frame, ["beta-8b"])
    assert set(rows["worker"]) == {"beta-8b"} and all(split_of(q) == "train" for q in rows["question_id"])


def test_no_train_split_rows_is_an_error_not_an_empty_model(frame):
    with pytest.raises(ValueError, match="no scored train-split rows"):
        fit_on_train_split(frame, synthetic_seats(), FAST_WORLD_MODEL, split_fn=lambda _qid: "eval")


def test_w_router_takes_ws_best_worker_and_beats_best_single_on_eval_questions(train_w):
    seats = tuple(synthetic_seats().values())
    router = WorldModelRouter(train_w, seats)
    held_out = [q for q in QUESTIONS if split_of(q.question_id) == "eval"]
    chosen = router.choose(held_out)
    predicted = train_w.predict_success(held_out, list(seats))
    assert chosen == [seats[i].name for i in predicted.argmax(axis=1)]
    workflow = router.route(held_out[0])
    assert workflow.workers == (chosen[0],) and workflow.steps[0].subtask == held_out[0].problem

    # Expected accuracy under the known truth: routing by subject must beat every single worker.
    def truth(worker: str, question: Question) -> float:
        return 1 / (1 + math.exp(-specialist_skill(worker, question.subject)))

    routed = np.mean([truth(w, q) for w, q in zip(chosen, held_out)])
    best_single = max(np.mean([truth(w, q) for q in held_out]) for w in SYNTHETIC_WORKERS)
    oracle = np.mean([max(truth(w, q) for w in SYNTHETIC_WORKERS) for q in held_out])
    assert best_single < routed <= oracle
    assert (routed - best_single) / (oracle - best_single) > 0.5


class FixedModel:
    """A world model with known outputs: two questions x three seats."""

    training_question_ids = frozenset()

    def predict_success(self, subtasks, workers):
        return np.array([[0.80, 0.75, 0.30], [0.20, 0.60, 0.55]])[: len(subtasks)]

    def predict_cost(self, subtasks, workers):
        return np.array([[0.010, 0.001, np.nan], [0.010, 0.004, 0.0001]])[: len(subtasks)]


def _seat(name: str, price: float = 0.0) -> WorkerSeat:
    return WorkerSeat(name=name, backend="replay", replay_source="zeroeval", model=name, description=name,
                      price_input_per_mtok=price, price_output_per_mtok=2 * price)


def test_lambda_trades_predicted_success_for_predicted_cost():
    seats = (_seat("pricey"), _seat("cheap"), _seat("unpriced"))
    questions = [Question(f"q{i}", "math", "test", f"problem {i}", "1") for i in range(2)]
    assert WorldModelRouter(FixedModel(), seats).choose(questions) == ["pricey", "cheap"]
    # lambda 10/USD: 0.80 - 0.10 < 0.75 - 0.01, and 0.60 - 0.04 > 0.55 - 0.001.
    assert WorldModelRouter(FixedModel(), seats, lambda_cost=10).choose(questions) == ["cheap", "cheap"]
    # A huge lambda: an unpriced worker (no cost prediction) is charged nothing, so it wins.
    assert WorldModelRouter(FixedModel(), seats, lambda_cost=1e4).choose(questions) == ["unpriced", "unpriced"]
    with pytest.raises(ValueError):
        WorldModelRouter(FixedModel(), seats, lambda_cost=-1)


def test_headroom_share_is_the_routers_gain_over_best_single_as_a_share_of_the_oracles():
    table = pl.DataFrame(
        {"arm": ["best_single", "oracle", "w_router", "solo:a"], "n": [100] * 4, "accuracy": [0.60, 0.70, 0.64, 0.5]}
    )
    value = routing_value(table, "w_router")
    assert value is not None and value["n"] == 100
    assert value["headroom_recovered"] == pytest.approx(0.4)
    assert (value["best_single"], value["accuracy"], value["oracle"]) == (0.60, 0.64, 0.70)
    worse = table.with_columns(accuracy=pl.Series([0.60, 0.70, 0.55, 0.5]))
    assert routing_value(worse, "w_router")["headroom_recovered"] == pytest.approx(-0.5)
    flat = table.with_columns(accuracy=pl.Series([0.60, 0.60, 0.60, 0.5]))
    assert routing_value(flat, "w_router")["headroom_recovered"] is None
    assert routing_value(table.filter(pl.col("arm") != "w_router"), "w_router") is None


def test_the_cascade_takes_the_cheapest_worker_w_trusts_and_falls_back_to_the_best_single():
    # List prices: cheap 0.3 < mid 3 < pricey 30 (input + output per Mtok), whatever the seat order.
    seats = (_seat("pricey", 10.0), _seat("cheap", 0.1), _seat("mid", 1.0))
    questions = [Question(f"q{i}", "math", "test", f"problem {i}", "1") for i in range(2)]
    # FixedModel: q0 -> pricey 0.80, cheap 0.75, mid 0.30; q1 -> 0.20, 0.60, 0.55.
    cascade = WCascadeRouter(FixedModel(), seats, fallback="pricey", threshold=0.7)
    assert cascade.name == "w_cascade@0.7"
    assert [seats[i].name for i in cascade.ladder] == ["cheap", "mid", "pricey"]
    assert cascade.choose(questions) == ["cheap", "pricey"]  # q1: no rung reaches 0.7 -> the fallback
    lower = WCascadeRouter(FixedModel(), seats, fallback="pricey", threshold=0.58)
    assert lower.choose(questions) == ["cheap", "cheap"]
    assert WCascadeRouter(FixedModel(), seats, fallback="mid", threshold=0.0).choose(questions) == ["cheap", "cheap"]
    assert WCascadeRouter(FixedModel(), seats, fallback="mid", threshold=0.9).choose(questions) == ["mid", "mid"]
    assert cascade.route(questions[0]).workers == ("cheap",)
    with pytest.raises(ValueError):
        WCascadeRouter(FixedModel(), seats, fallback="pricey", threshold=1.5)
    with pytest.raises(ValueError):
        WCascadeRouter(FixedModel(), seats, fallback="nobody")


def test_cascade_choice_is_vectorised_over_questions():
    success = np.array([[0.9, 0.2], [0.1, 0.8], [0.1, 0.1]])
    assert cascade_choice(success, ladder=[1, 0], fallback=0, threshold=0.5).tolist() == [0, 1, 0]
    assert cascade_choice(success, ladder=[0, 1], fallback=1, threshold=0.5).tolist() == [0, 1, 1]
