"""The state of one workflow execution and the rows it records.

What the orchestrator (`conductor.orchestrator`) and its recursive steps (`conductor.recursion`)
share: each executed step's outcome, what every row of a top-level workflow carries (its lineage),
the running totals of an execution, what a step is shown, when an agreeing vote seat ends the
spending, how the final answer is graded, and the `calls` rows of worker steps and conductor replies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from conductor_pipeline.conductor.protocols import PolicyOutput
from conductor_pipeline.grading import Grade, grade
from conductor_pipeline.pools.backends.base import RecordedWorker, Worker
from conductor_pipeline.pools.backends.vote import tally_votes
from conductor_pipeline.records import CallRecord, CallResult, CallStatus, ChatMessage, Question, RolloutTag, stable_id
from conductor_pipeline.workflow import Step, Workflow

# Statuses that make a workflow an infrastructure failure instead of an answer.
INFRA_STATUSES = frozenset({CallStatus.TRANSIENT, CallStatus.NOT_RECORDED})
# Parse code of a workflow whose conductor never answered (policy down after retries).
NOT_RUN = "not_run"
# How the original question is shown with a subtask when `include_question` is on.
QUESTION_AND_SUBTASK_TEMPLATE = "Original question:\n{question}\n\nYour task:\n{subtask}"


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one executed step produced; later steps read `subtask` and `response` from here."""

    index: int
    worker: str
    subtask: str
    response: str | None
    status: CallStatus
    recorded_correct: bool | None = None
    graded: Grade | None = None  # set where the step was graded for its `calls` row; reused as the final grade


@dataclass(frozen=True, slots=True)
class Lineage:
    """What every row of one top-level workflow shares, nested workflows included."""

    run_id: str
    root_workflow_id: str
    conductor_name: str
    arm: str | None
    sample: int
    rollout: RolloutTag | None
    record: bool = True


@dataclass(slots=True)
class Execution:
    """The running state of one (possibly nested) workflow execution."""

    outcomes: list[StepOutcome] = field(default_factory=list)
    infra_failure: bool = False
    cost_usd: float = 0.0
    latency_s: float | None = None  # None until some call reports one (replay records none)
    stopped_early: bool = False  # a stopping rule ended it before its last step (`Orchestrator.execute`)
    skipped: frozenset[int] = frozenset()  # steps an agreeing vote seat skipped (`stop_when_first_agree`)

    def outcome_of(self, index: int) -> StepOutcome | None:
        """What step `index` produced (None: it has not run, or an agreeing vote skipped it)."""
        return next((outcome for outcome in self.outcomes if outcome.index == index), None)

    def seen_by(self, step: Step) -> list[StepOutcome]:
        """The earlier steps `step` sees that ran (an agreeing vote's skipped steps are not shown)."""
        return [outcome for outcome in map(self.outcome_of, step.sees) if outcome is not None]


def step_messages(
    question: Question, seen: Sequence[StepOutcome], step: Step, *, include_question: bool
) -> tuple[ChatMessage, ...]:
    """The `seen` steps as (user: subtask, assistant: response) turns, then this subtask."""
    messages: list[ChatMessage] = []
    for earlier in seen:
        messages.append(ChatMessage("user", earlier.subtask))
        messages.append(ChatMessage("assistant", earlier.response or ""))
    content = step.subtask
    # A solo arm's subtask *is* the question: showing it twice would change the prompt.
    if include_question and step.subtask.strip() != question.problem.strip():
        content = QUESTION_AND_SUBTASK_TEMPLATE.format(question=question.problem, subtask=step.subtask)
    messages.append(ChatMessage("user", content))
    return tuple(messages)


def agreement_steps(workflow: Workflow, quorum: int | None) -> tuple[int, ...] | None:
    """The steps whose agreement ends a workflow early: the first `quorum` steps its last step sees
    (the last step's seat's `stop_when_first_agree`), when some step between them and that vote
    is left to skip (None otherwise)."""
    first = tuple(sorted(workflow.steps[-1].sees))[:quorum] if quorum else ()
    if not quorum or len(first) < quorum or first[-1] >= len(workflow.steps) - 2:
        return None
    return first


def all_agree(responses: Sequence[str | None]) -> bool:
    """Whether every response states an answer and all are one answer, as the vote groups them."""
    tally = tally_votes(responses)
    return tally.answer is not None and tally.votes == len(responses)


def add_latency(total: float | None, more: float | None) -> float | None:
    """Sum latencies where known; unknown (None) stays unknown instead of reading as 0 s."""
    if more is None:
        return total
    return more if total is None else total + more


class CompletionScore(NamedTuple):
    """What one scored conductor completion gave: the reward's inputs."""

    parse_code: str
    correct: bool | None
    final_worker: str | None  # the real name of the worker whose answer is final; None if unparsed


def workflow_key(run_id: str, arm: str | None, repeat: int, question_id: str, conductor_name: str) -> str:
    """The workflow id: stable, so a rerun of the same run writes (and skips) the same keys."""
    return stable_id("workflow", run_id, arm, repeat, question_id, conductor_name)


def rollout_fields(rollout: RolloutTag | None) -> dict[str, object]:
    """The `workflows` columns of a training rollout (none for an evaluation workflow)."""
    if rollout is None:
        return {}
    return {"phase": rollout.phase, "training_step": rollout.training_step, "rollout": rollout.rollout}


def one_step_workflow(worker: str, question: Question) -> Workflow:
    """The workflow of a solo arm or a router: one worker, the question itself as the subtask."""
    return Workflow(steps=(Step(worker=worker, subtask=question.problem, sees=()),))


def broadcast_workflow(workers: Sequence[str], question: Question) -> Workflow:
    """Every worker answers the question alone, in this order (a vote's or a cascade's workflow)."""
    return Workflow(steps=tuple(Step(worker=worker, subtask=question.problem, sees=()) for worker in workers))


def sample_for(worker: Worker, repeat: int) -> int:
    """The recorded sample a repeat replays; a one-recording source replays its only sample.

    Live workers sample anew on every call whatever the index; replay seats hold a fixed number
    of recordings, and asking past them would turn every later repeat into `not_recorded`.
    """
    if isinstance(worker, RecordedWorker) and worker.samples_recorded > 0:
        return repeat % worker.samples_recorded
    return repeat


async def grade_final(
    state: Execution, gold: str, final_step: Callable[[Sequence[StepOutcome]], int] | None = None
) -> tuple[str | None, bool]:
    """(extracted answer, correct) of the final step (the last, unless `final_step` picks one)."""
    if final_step is not None and state.outcomes:
        last = state.outcomes[await asyncio.to_thread(final_step, tuple(state.outcomes))]
    else:
        last = state.outcomes[-1] if state.outcomes else None
    graded = last.graded if last is not None and last.graded is not None else None
    if graded is None:  # not graded yet (nothing recorded, e.g. a GRPO rollout)
        graded = await asyncio.to_thread(grade, last.response if last is not None else None, gold)
    recorded = last.recorded_correct if last is not None else None
    # Verdict-only replays (no text) carry the recorded verdict; use it as is.
    return graded.extracted, recorded if recorded is not None else graded.correct


def step_call_record(
    result: CallResult,
    *,
    key: str,
    workflow_id: str,
    run_id: str,
    question: Question,
    step: Step,
    index: int,
    sample: int,
    extracted: str | None,
    correct: bool | None,
    pool: str,
    visible_steps: int,
    cost_usd: float | None,
) -> CallRecord:
    return CallRecord(
        call_id=stable_id("step", key, index), run_id=run_id, kind="step",
        question_id=question.question_id, worker=step.worker, sample=sample, subtask=step.subtask,
        response=result.response, extracted_answer=extracted, correct=correct, status=str(result.status),
        error=result.error, prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
        cost_usd=cost_usd, latency_s=result.latency_s, started_at=result.started_at, pool=pool,
        workflow_id=workflow_id, step=index, reasoning_tokens=result.reasoning_tokens,
        tokens_estimated=result.tokens_estimated, finish_reason=result.finish_reason, attempts=result.attempts,
        visible_steps=visible_steps,
    )


def conductor_call_record(
    output: PolicyOutput,
    *,
    key: str,
    workflow_id: str,
    run_id: str,
    question: Question,
    conductor_name: str,
    depth: int,
    sample: int,
    pool: str,
) -> CallRecord:
    return CallRecord(
        call_id=stable_id("conductor", key, depth), run_id=run_id, kind="conductor",
        question_id=question.question_id, worker=conductor_name, sample=sample, subtask=None,
        response=output.text, extracted_answer=None, correct=None, status=str(CallStatus.OK), error=None,
        prompt_tokens=output.prompt_tokens, completion_tokens=output.completion_tokens, cost_usd=None,
        latency_s=output.latency_s, started_at=None, pool=pool, workflow_id=workflow_id, step=None,
    )
