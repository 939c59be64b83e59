"""The world model's topology feature: how many earlier results a step saw, stored with the call,
read into the training frame, and used alike at fit and at scoring time; and W on aggregator steps."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.records import CallRecord, Question
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.aggregator_steps import evaluate_aggregator_steps
from conductor_pipeline.world_model.cross_validation import EvaluationSettings
from conductor_pipeline.world_model.data import load_training_frame
from conductor_pipeline.world_model.features import build_features
from conductor_pipeline.world_model.model import WorldModel, fit_on_train_split, fit_train_split_world_model
from conductor_pipeline.world_model.prompts_and_pruning import (
    predicted_success_for_prompt,
    prompt_predictor,
    prune_zero_variance,
)
from tests.builders import FAST_WORLD_MODEL, specialist_skill, synthetic_frame, synthetic_questions, synthetic_seats

VOTE = WorkerSeat(name="majority-vote", backend="vote", model="majority-vote", description="majority of what it sees")
EVAL = EvaluationSettings(question_folds=3, n_bootstrap=60, held_out_workers=False, model=FAST_WORLD_MODEL)
# A synthetic vote: shown nothing it abstains; shown more steps it is right more often.
VOTE_SUCCESS = {0: 0.0, 1: 0.35, 2: 0.5, 3: 0.7, 4: 0.85}


def seats_with_vote() -> dict[str, WorkerSeat]:
    return synthetic_seats() | {VOTE.name: VOTE}


def topology_frame(n_questions: int, seed: int) -> pl.DataFrame:
    """Probe-like rows of the six synthetic workers (0 visible steps), plus vote steps shown 0..4."""
    questions = synthetic_questions(n_questions, seed=seed)
    probes = synthetic_frame(questions, specialist_skill, seed=seed + 1).with_columns(visible_steps=pl.lit(0))
    rng = np.random.default_rng(seed + 2)
    votes = [
        {
            "question_id": q.question_id, "worker": VOTE.name, "subtask": "Give the majority answer.",
            "problem": q.problem, "corpus": q.corpus, "subject": q.subject, "level": q.level,
            "correct": bool(rng.random() < VOTE_SUCCESS[k]), "visible_steps": k,
        }
        for q in questions
        for k in VOTE_SUCCESS
    ]
    return pl.concat([probes, pl.DataFrame(votes, schema=probes.schema)])


def test_visible_steps_is_the_last_feature_and_unknown_stays_missing() -> None:
    frame = pl.DataFrame({
        "worker": ["alpha-7b", VOTE.name, VOTE.name], "subtask": ["a", "b", "b"], "visible_steps": [0, 3, None],
        "correct": [True, False, True], "question_id": ["q0", "q1", "q1"],
    })
    matrix, names = build_features(frame, seats_with_vote(), text_model=None)
    assert names[-1] == "visible_steps"
    np.testing.assert_array_equal(matrix[:, -1], [0.0, 3.0, np.nan])
    without, _ = build_features(frame.drop("visible_steps"), seats_with_vote(), text_model=None)
    assert np.isnan(without[:, -1]).all()


def test_w_predicts_an_aggregator_step_from_how_many_results_it_sees() -> None:
    frame = topology_frame(240, seed=20)
    model = WorldModel.fit(frame, seats_with_vote(), FAST_WORLD_MODEL)
    question = Question("new", "math", "test", "Solve the equation for x.", "1", subject="Algebra", level=2)
    asks = pl.DataFrame({
        "worker": [VOTE.name] * 5, "subtask": ["Give the majority answer."] * 5,
        "problem": [question.problem] * 5, "corpus": ["math"] * 5, "subject": ["Algebra"] * 5, "level": [2] * 5,
        "visible_steps": list(VOTE_SUCCESS),
    })
    predicted = model.predict_frame(asks)
    assert predicted[0] < 0.1 and predicted[4] > 0.6 and np.all(np.diff(predicted) > -0.05)
    # Scoring a question (asked alone) goes through the same features with 0 visible steps.
    alone = model.predict_success([question], [VOTE])[0, 0]
    assert alone == pytest.approx(model.predict_frame(asks.head(1).with_columns(subtask=pl.lit(question.problem)))[0])


def test_w_beats_the_marginal_on_aggregator_steps_out_of_sample() -> None:
    report = evaluate_aggregator_steps(topology_frame(240, seed=30), seats_with_vote(), EVAL)
    assert report is not None and report.workers == [VOTE.name]
    assert report.n_rows == 240 * len(VOTE_SUCCESS) and report.n_questions == 240
    assert report.beats_marginal("log_loss") and "BEATS the worker marginal" in report.verdict
    table = {row["visible_steps"]: row for row in report.by_visible_steps.iter_rows(named=True)}
    assert table[0]["observed"] == 0.0 and table[0]["w_mean"] < 0.1
    assert table[4]["w_mean"] > table[1]["w_mean"]
    # The marginal gives every aggregator step the same rate, whatever it saw.
    assert max(r["marginal_mean"] for r in table.values()) - min(r["marginal_mean"] for r in table.values()) < 0.05
    assert evaluate_aggregator_steps(synthetic_frame(synthetic_questions(30, 1), specialist_skill, 2),
                                     seats_with_vote(), EVAL) is None


def test_w_hooks_give_no_number_for_a_seat_that_cannot_answer_alone() -> None:
    frame = topology_frame(120, seed=40)
    model = WorldModel.fit(frame, seats_with_vote(), FAST_WORLD_MODEL)
    question = synthetic_questions(1, seed=41)[0]
    shown = prompt_predictor(model, seats_with_vote())(question)
    assert VOTE.name not in shown and set(shown) == set(synthetic_seats())
    assert predicted_success_for_prompt(model, question, [VOTE]) != {}  # asked directly, W still answers
    # The vote's P(success) alone is ~0: weighed in pruning it would make every question look unsolvable.
    assert prune_zero_variance(model, [question], seats_with_vote(), low=0.05) == \
        prune_zero_variance(model, [question], synthetic_seats(), low=0.05)
    with pytest.raises(ValueError, match="at least one seat that answers alone"):
        prune_zero_variance(model, [question], [VOTE])


def step_call(
    call_id: str, kind: str, worker: str, visible_steps: int, *, question_id: str = "q0", correct: bool = True,
    subtask: str | None = None, pool: str = "pool-a",
) -> CallRecord:
    return CallRecord(
        call_id=call_id, run_id="r", kind=kind, question_id=question_id, worker=worker, sample=0, subtask=subtask,
        response="\\boxed{1}", extracted_answer="1", correct=correct, status="ok", error=None, prompt_tokens=1,
        completion_tokens=1, cost_usd=0.0, latency_s=None, started_at=datetime(2026, 1, 1),
        visible_steps=visible_steps, pool=pool,
    )


def test_a_warehouse_written_before_the_column_migrates_and_old_steps_stay_unknown(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    store = Warehouse(path)
    store.insert("questions", [Question("q0", "math", "test", "What is 1?", "1")])
    old = [step_call("old-probe", "probe", "alpha-7b", 0), step_call("old-step", "step", "alpha-7b", 1)]
    store.insert("calls", old)
    with store.connect() as con:  # as a file from before the column existed
        con.execute("ALTER TABLE calls DROP COLUMN visible_steps")
    reopened = Warehouse(path)  # applies the schema again: the column comes back, NULL for old rows
    reopened.insert("calls", [step_call("new-vote", "step", VOTE.name, 3)])
    rows = reopened.query("SELECT call_id, visible_steps FROM calls ORDER BY call_id")
    assert dict(rows.iter_rows()) == {"new-vote": 3, "old-probe": None, "old-step": None}
    # Training rows come ordered by question, worker, sample, call id: old probe, old step, new vote.
    # A probe always answered alone; an old step's topology is unknown, not 0.
    assert load_training_frame(reopened)["visible_steps"].to_list() == [0, None, 3]


def test_a_pools_training_rows_leave_out_the_other_pools_seats(tmp_path: Path) -> None:
    """The warehouse holds every pool's probes, test models' too: a pool's W reads its own seats only."""
    store = Warehouse(tmp_path / "w.duckdb")
    store.insert("questions", [Question("q0", "math", "test", "What is 1?", "1")])
    store.insert("calls", [step_call("p1", "probe", "alpha-7b", 0), step_call("p2", "probe", "gpt-4o-mini", 0)])
    assert sorted(load_training_frame(store)["worker"].to_list()) == ["alpha-7b", "gpt-4o-mini"]
    assert load_training_frame(store, ["alpha-7b", "beta-13b"])["worker"].to_list() == ["alpha-7b"]


def test_the_w_a_conductor_reads_is_fitted_on_the_probes_alone(tmp_path: Path) -> None:
    """Rollout and eval steps are whatever ran in the warehouse before (other seeds, recipes, reruns):
    the eval's train-split W, which fills '+W' catalogues and routes the W-router, must not move with them."""
    store = Warehouse(tmp_path / "w.duckdb")
    questions = synthetic_questions(60, seed=5)
    seats = [synthetic_seats()[name] for name in list(synthetic_seats())[:2]]
    store.insert("questions", questions)
    # The first worker solves the even questions, the second the multiples of three.
    store.insert("calls", [
        step_call(f"p-{seat.name}-{q.question_id}", "probe", seat.name, 0, question_id=q.question_id,
                  correct=i % (2 + k) == 0)
        for i, q in enumerate(questions) for k, seat in enumerate(seats)
    ])
    before = fit_train_split_world_model(store, "pool-a", seats, FAST_WORLD_MODEL).predict_success(questions, seats)
    # Another seed's training wrote steps on the same questions, every one of them wrong.
    store.insert("calls", [
        step_call(f"s-{seat.name}-{q.question_id}", "step", seat.name, 1, question_id=q.question_id,
                  correct=False, subtask="Check the arithmetic.")
        for q in questions for seat in seats
    ])
    assert set(load_training_frame(store)["source"]) == {"probe", "eval"}
    assert set(load_training_frame(store, probes_only=True)["source"]) == {"probe"}
    after = fit_train_split_world_model(store, "pool-a", seats, FAST_WORLD_MODEL).predict_success(questions, seats)
    np.testing.assert_array_equal(after, before)
    # The world_model asset's W reads every scored step, so it does move: the steps are not ignored by accident.
    everything = WorldModel.fit(load_training_frame(store), {seat.name: seat for seat in seats}, FAST_WORLD_MODEL)
    assert not np.array_equal(everything.predict_success(questions, seats), before)


def test_a_pools_w_reads_its_own_probes_once_whatever_other_pools_probed(tmp_path: Path) -> None:
    """Two pool files that seat the same worker each probe it: the second pool's W must be the W of a
    warehouse that never saw the first, not one fitted on its rows twice."""
    store = Warehouse(tmp_path / "w.duckdb")
    questions = synthetic_questions(60, seed=7)
    seats = [synthetic_seats()[name] for name in list(synthetic_seats())[:2]]
    store.insert("questions", questions)

    def probes(pool: str, correct_when: int) -> list[CallRecord]:
        return [
            step_call(f"{pool}-{seat.name}-{q.question_id}", "probe", seat.name, 0, question_id=q.question_id,
                      correct=i % (2 + k + correct_when) == 0, pool=pool)
            for i, q in enumerate(questions) for k, seat in enumerate(seats)
        ]

    store.insert("calls", probes("pool-a", 0))
    alone = fit_train_split_world_model(store, "pool-a", seats, FAST_WORLD_MODEL).predict_success(questions, seats)
    store.insert("calls", probes("pool-b", 1))  # another pool file, the same workers, other outcomes
    assert len(load_training_frame(store, pool="pool-a")) == len(load_training_frame(store)) // 2
    after = fit_train_split_world_model(store, "pool-a", seats, FAST_WORLD_MODEL).predict_success(questions, seats)
    np.testing.assert_array_equal(after, alone)
    # Read across pools, the same worker's rows are pooled: the W moves, so the filter is what holds it.
    across = fit_on_train_split(load_training_frame(store, probes_only=True), {s.name: s for s in seats}, FAST_WORLD_MODEL)
    assert not np.array_equal(across.predict_success(questions, seats), alone)


def test_subject_and_level_describe_a_step_shown_earlier_results() -> None:
    rows = pl.DataFrame({
        "worker": [VOTE.name] * 3, "subtask": ["Give the majority answer."] * 3, "problem": ["Find the area."] * 3,
        "subject": ["Geometry"] * 3, "level": [4] * 3, "visible_steps": [0, 2, None],
        "correct": [False, True, True], "question_id": ["q0"] * 3,
    })
    matrix, names = build_features(rows, seats_with_vote(), text_model=None)
    level = matrix[:, names.index("level")]
    # A piece of the question asked alone (or of unknown topology) has no level; one shown results has.
    assert np.isnan(level[0]) and level[1] == 4 and np.isnan(level[2])
    assert not np.isnan(matrix[1, names.index("subject")]) and matrix[1, names.index("whole_question")] == 0
