"""The vote backend: the majority of the answers shown, under the grader's equivalence."""

from __future__ import annotations

import asyncio

import pytest

from conductor_pipeline.grading import grade
from conductor_pipeline.pools.backends import RecordedWorker, Worker
from conductor_pipeline.pools.backends.registry import build_worker
from conductor_pipeline.pools.backends.vote import VoteWorker, tally_votes, vote_response
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat
from conductor_pipeline.records import CallRequest, CallStatus, ChatMessage
from tests.builders import SAMPLE_QUESTION

VOTE_SEAT = WorkerSeat(name="vote", backend="vote", model="majority-vote", description="majority of what it sees")


def vote(*responses: str | None):
    worker = build_worker(VOTE_SEAT, PoolConfig(name="p", workers=[VOTE_SEAT]))
    request = CallRequest(
        question=SAMPLE_QUESTION, messages=(ChatMessage("user", "Pick the majority."),), visible_responses=responses
    )
    return asyncio.run(worker.call(request))


def test_one_half_in_three_spellings_is_one_answer_and_wins() -> None:
    result = vote("so x = \\boxed{3}", "\\boxed{1/2}", "The answer is \\boxed{0.5}", "\\boxed{\\frac{1}{2}}")
    assert result.status == CallStatus.OK and result.error is None
    # The winner is read back by the grader as the group's earliest spelling.
    assert grade(result.response, "0.5").extracted == "1/2" and grade(result.response, "\\frac12").correct
    assert "3 of the 4 answers shown agree" in result.response
    assert result.cost_usd == 0.0 and result.prompt_tokens is None and result.completion_tokens is None
    assert result.latency_s is None


def test_a_tie_goes_to_the_earliest_step_and_steps_without_an_answer_do_not_vote() -> None:
    assert tally_votes(["\\boxed{7}", "\\boxed{5}"]).answer == "7"
    assert tally_votes(["\\boxed{5}", "\\boxed{7}"]).answer == "5"
    # Two for 7, two for 5 (first seen later), plus steps that state nothing.
    tally = tally_votes([None, "I am not sure.", "\\boxed{5}", "\\boxed{7}", "#### 7", "\\boxed{5.0}", ""])
    assert (tally.answer, tally.votes, tally.answered, tally.shown) == ("5", 2, 4, 7)
    assert tally_votes(["\\boxed{5}", "\\boxed{7}", "Final answer: 7"]).answer == "7"  # a majority beats order


@pytest.mark.parametrize(
    ("responses", "why"),
    [((), "access list is empty"), ((None, "no answer stated here"), "2 earlier step(s), none of which states")],
)
def test_a_vote_that_sees_no_answer_abstains_with_a_scored_empty_status(responses: tuple, why: str) -> None:
    result = vote(*responses)
    assert result.status == CallStatus.EMPTY and result.response is None and why in result.error
    # Scored: an aggregator given nothing is the workflow's failure, not an outage to exclude.
    assert CallStatus(result.status).scored and result.cost_usd == 0.0


def test_an_answer_the_box_cannot_hold_is_answered_with_the_winning_response() -> None:
    winner = 'Done. {"answer": "x}"}'
    tally = tally_votes([winner])
    assert tally.answer == "x}"
    assert vote_response(tally) == winner and grade(vote_response(tally), "0").extracted == "x}"


def test_the_vote_is_a_worker_not_a_recorded_one_and_only_for_vote_seats() -> None:
    worker = build_worker(VOTE_SEAT, PoolConfig(name="p", workers=[VOTE_SEAT]), data_path="/ignored")
    assert isinstance(worker, VoteWorker) and isinstance(worker, Worker) and not isinstance(worker, RecordedWorker)
    replay = WorkerSeat(name="r", backend="replay", replay_source="zeroeval", model="m", description="d")
    with pytest.raises(ValueError, match="worker 'r' is not a vote seat"):
        VoteWorker(replay)
