"""Broadcast and vote: answers grouped by the grader, ties to the best-ranked worker, and the vote
arm run through the orchestrator with every worker's answer recorded as a call."""

from __future__ import annotations

import asyncio

import pytest

from conductor_pipeline.evaluation.arms import VoteArm, run_arm
from conductor_pipeline.evaluation.lineup import eval_lineup, ranked_workers, vote_arms
from conductor_pipeline.evaluation.routers import BestSingleChoice
from conductor_pipeline.evaluation.vote import majority_index
from conductor_pipeline.records import Question
from conductor_pipeline.warehouse import Warehouse
from tests.builders import RecordingWorker, make_pool, orchestrate, seat

HALF = Question(
    question_id="test/algebra/9.json", corpus="math", split="test", problem="Half of one?", answer="\\frac{1}{2}"
)


def test_equivalent_spellings_are_one_vote():
    # 1/2, 0.5 and \frac12 agree by the grader, not by their strings: three votes beat two.
    assert majority_index(["3", "1/2", "3", "0.5", "\\frac{1}{2}"]) == 1


def test_ties_go_to_the_group_of_the_best_ranked_voter_and_abstentions_do_not_count():
    assert majority_index(["4", "3", "3", "4"]) == 0
    assert majority_index([None, "4", "3"]) == 1  # the best-ranked voter abstained
    assert majority_index([None, "7", None, "7", "2"]) == 1
    assert majority_index([None, None]) == 0  # nobody answered: the best-ranked voter answers (wrong)
    with pytest.raises(ValueError):
        majority_index([])


def test_the_vote_arm_records_every_call_and_answers_with_the_majority(tmp_path):
    pool = make_pool(seat("a"), seat("b"), seat("c"), seat("d"))
    workers = {"a": RecordingWorker("a", answer="7"), "b": RecordingWorker("b", answer="0.5"),
               "c": RecordingWorker("c", answer="1/2"), "d": RecordingWorker("d", answer="7")}
    warehouse = Warehouse(tmp_path / "w.duckdb")
    orchestrator = orchestrate(pool, workers, warehouse)
    # 7 (a, d) ties with 1/2 (b, c): the tie goes to a, ranked first, and the vote is wrong.
    (tied,) = asyncio.run(run_arm(orchestrator, VoteArm("all", ("a", "b", "c", "d")), [HALF], run_id="eval-vote"))
    assert tied.final_answer == "7" and tied.correct is False
    # Ranked b first, the same answers vote 1/2: right, and answered by b's step.
    (right,) = asyncio.run(run_arm(orchestrator, VoteArm("b-first", ("b", "a", "c", "d")), [HALF], run_id="eval-vote"))
    assert right.final_answer == "0.5" and right.correct is True
    assert right.workers == ["b", "a", "c", "d"] and right.n_steps == 4
    assert right.cost_usd == pytest.approx(4 * 0.001)  # every worker's call, summed
    calls = warehouse.query(
        "SELECT worker, subtask, sum(prompt_tokens + completion_tokens) AS tokens FROM calls "
        "WHERE workflow_id = $w GROUP BY ALL", {"w": right.workflow_id}
    )
    assert sorted(calls["worker"]) == ["a", "b", "c", "d"] and set(calls["tokens"]) == {15}
    assert set(calls["subtask"]) == {HALF.problem}  # each worker answers the question alone
    # Every worker saw only the question: no step sees another's answer.
    assert all(len(r.messages) == 1 for w in workers.values() for r in w.requests)


def test_vote_arms_are_all_workers_and_the_best_k_of_the_train_split():
    choice = BestSingleChoice(
        worker="c", accuracies={"c": 0.8, "a": 0.7, "d": 0.6, "b": 0.5}, calibration_question_ids=frozenset()
    )
    ranked = ranked_workers(choice, ["a", "b", "c", "d", "e"])
    assert ranked == ["c", "a", "d", "b", "e"]  # e was not rated: last
    arms = vote_arms(ranked, [3, 5, 1])
    assert [(arm.name, arm.workers) for arm in arms] == [
        ("vote:all", ("c", "a", "d", "b", "e")), ("vote:top3", ("c", "a", "d"))
    ]  # top5 is every worker, top1 is the best single worker
    lineup = eval_lineup([seat(w) for w in "abcd"], choice, vote_top_k=[3])
    assert lineup.names[-2:] == ["vote:all", "vote:top3"]
    with pytest.raises(ValueError):
        VoteArm("one", ("a",))
