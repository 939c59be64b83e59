"""Vote backend: an aggregator seat that answers with the majority of the answers it is shown.

A vote calls no model. It reads the final answer of each earlier step its access list lets it see
(the orchestrator passes those responses as `CallRequest.visible_responses`, in step order),
groups the answers by the grader's equivalence and answers with the largest group's answer. On
recorded answers it is the one seat whose output depends on what it is shown, so it is what lets
a fan-out topology (several workers, then a step that sees their results) beat routing.

Rules:

- An answer is what the grader extracts from a response (`extract_answer`); a step without text,
  or whose text states no answer, does not vote.
- Answers are grouped in step order: an answer joins the first group whose representative (the
  group's earliest answer) it is equivalent to under the grader, with the representative in the
  gold's place (`is_equivalent(answer, representative)`), so "1/2", "0.5" and "\\frac{1}{2}" are
  one answer.
- A tie goes to the group whose first answer comes earliest in step order. The conductor orders
  the steps, so a tie resolves to the worker it put first; abstaining instead would turn every
  two-way disagreement into no answer, which is never better than giving one of the two.
- A vote that sees no answer abstains: status `empty` and no response. That status is scored (a
  wrong answer), not an infrastructure failure: a workflow whose aggregator is shown nothing is
  the conductor's mistake and must cost it the reward.

A vote seat with `stop_when_first_agree` is the same vote; the orchestrator, which runs the steps,
skips the ones not yet run when the first answers it sees agree (`conductor.execution.agreement_steps`),
and the vote then counts what ran.

It records no tokens (no model read or wrote any), costs nothing and reports no latency: its own
time is negligible next to any model call, and a figure here would give replay workflows, which
have no measured latency, a latency they do not have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from conductor_pipeline.grading import extract_answer, is_equivalent
from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.records import CallRequest, CallResult, CallStatus


# The fewest answers a vote can do anything with. Over one it is that answer; over two it is the
# first one (they agree, or the tie goes to the earlier step) unless the first states none: a
# conductor's vote must see three or more to overrule any worker.
MIN_VOTE_INPUTS = 3


@dataclass(frozen=True, slots=True)
class VoteTally:
    """What one vote counted: the winning answer (None: it abstained) and the counts behind it."""

    answer: str | None  # the winning group's representative, as the grader extracted it
    winner_response: str | None  # the response that answer was extracted from (the group's earliest)
    votes: int  # answers in the winning group
    answered: int  # shown responses that hold an answer
    shown: int  # responses the vote was shown

    def describe(self) -> str:
        if self.answer is None:
            if self.shown == 0:
                return "vote shown no earlier step: its access list is empty"
            return f"vote shown {self.shown} earlier step(s), none of which states an answer"
        return (
            f"Vote: {self.votes} of the {self.answered} answers shown agree "
            f"({self.shown} earlier step(s) shown; ties go to the earliest step)."
        )


def tally_votes(responses: Sequence[str | None]) -> VoteTally:
    """The majority answer among `responses` (in step order) under the grader's equivalence."""
    groups: list[tuple[str, str, int]] = []  # (representative, its response, votes), in first-seen order
    answered = 0
    for response in responses:
        answer = extract_answer(response) if response else None
        if answer is None:
            continue
        answered += 1
        for index, (representative, source, votes) in enumerate(groups):
            if is_equivalent(answer, representative):
                groups[index] = (representative, source, votes + 1)
                break
        else:
            groups.append((answer, response, 1))
    if not groups:
        return VoteTally(None, None, 0, answered, len(responses))
    # max() keeps the first of equal counts: the group whose first answer is earliest.
    representative, source, votes = max(groups, key=lambda group: group[2])
    return VoteTally(representative, source, votes, answered, len(responses))


def vote_response(tally: VoteTally) -> str | None:
    """The vote's reply: one line of counts and the answer boxed, or, when boxing would not read
    back as the same answer (a representative the box syntax cannot hold), the winning response
    itself, from which the grader extracts exactly that answer again."""
    if tally.answer is None:
        return None
    text = f"{tally.describe()}\n\\boxed{{{tally.answer}}}"
    return text if extract_answer(text) == tally.answer else tally.winner_response


@dataclass
class VoteWorker:
    """A pool seat (the `Worker` protocol) that answers with the majority of the answers shown to it."""

    seat: WorkerSeat

    def __post_init__(self) -> None:
        if not self.seat.is_vote:
            raise ValueError(f"worker {self.seat.name!r} is not a vote seat")
        self.name = self.seat.name

    async def call(self, request: CallRequest) -> CallResult:
        started_at = datetime.now(UTC)
        # Equivalence may ask math-verify (a blocking pipe to a worker process): off the event loop.
        tally = await asyncio.to_thread(tally_votes, request.visible_responses)
        if tally.answer is None:
            return CallResult(status=CallStatus.EMPTY, error=tally.describe(), cost_usd=0.0, started_at=started_at)
        return CallResult(status=CallStatus.OK, response=vote_response(tally), cost_usd=0.0, started_at=started_at)

    async def aclose(self) -> None:
        """Nothing to release."""
