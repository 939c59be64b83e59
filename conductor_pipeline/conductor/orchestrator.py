"""Execute conductor workflows against a worker pool, as the Conductor paper does.

A workflow is up to five steps run in order. Each worker's context holds, as earlier chat
turns, the subtask and response of every step in its access list, then its own subtask (and,
configurably, the original question). The last step's extracted answer is the workflow's answer.
Every step becomes a `calls` row (`kind='step'`) and every workflow a `workflows` row, so the
evaluation tables and the training reward read the same telemetry.

Why a workflow can end as an *infrastructure failure* rather than a wrong answer: a step whose
call stayed transient after its retries (or that replay has no recording for) says nothing
about the routing; scoring it would punish the conductor for a provider's outage.

A seat with backend `vote` answers from what it is shown: besides the chat turns, its request
carries the visible steps' responses (`CallRequest.visible_responses`), and since it calls no model
it takes no governor slot. Each step's `calls` row records how many earlier results it saw
(`visible_steps`), the world model's topology feature.

Recursion: a pool seat with backend `conductor` is the conductor itself. Such a step prompts
the conductor again with the parent workflow and the answer so far; its reply is either a new
workflow (executed one level deeper; its answer becomes the step's answer) or three empty lists
(pass the answer through). Depth is capped so a policy cannot recurse forever. Each reply is a
`workflows` row of its own (linked to the calling workflow, step and the top-level workflow,
with its depth) whose step calls carry its id, so what recursion did can be read back per level;
the calling step's own `calls` row carries no cost, since the inner calls carry it. The inner
conductor samples with a seed drawn from the inner workflow's id, so a rerun writes the same rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from conductor_pipeline.conductor.prompt import (
    CatalogueEntry,
    build_recursion_prompt,
    catalogue_from_pool,
    displayed_worker_names,
)
from conductor_pipeline.conductor.protocols import ConductorPolicy, PolicyError, PolicyOutput
from conductor_pipeline.grading import Grade, grade
from conductor_pipeline.pools.backends.base import RecordedWorker, Worker
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat
from conductor_pipeline.pools.governor import Governor, estimate_call_tokens
from conductor_pipeline.records import (
    CallRecord,
    CallRequest,
    CallResult,
    CallStatus,
    ChatMessage,
    Question,
    RolloutTag,
    WorkflowRecord,
    stable_id,
)
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.workflow import DEFAULT_MAX_STEPS, PARSE_OK, Step, Workflow, WorkflowParseError, parse_workflow

# The paper caps recursion; two levels already let a conductor fix its own first plan.
DEFAULT_MAX_DEPTH = 2
# Rows are buffered and written in batches: one warehouse transaction per workflow would hold
# the inter-process lock thousands of times per evaluation.
DEFAULT_FLUSH_EVERY_ROWS = 2000
# How the original question is shown with a subtask when `include_question` is on.
QUESTION_AND_SUBTASK_TEMPLATE = "Original question:\n{question}\n\nYour task:\n{subtask}"
# Statuses that make a workflow an infrastructure failure instead of an answer.
INFRA_STATUSES = frozenset({CallStatus.TRANSIENT, CallStatus.NOT_RECORDED})
# Parse code of a workflow whose conductor never answered (policy down after retries).
NOT_RUN = "not_run"


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
class _Lineage:
    """What every row of one top-level workflow shares, nested workflows included."""

    run_id: str
    root_workflow_id: str
    conductor_name: str
    arm: str | None
    sample: int
    rollout: RolloutTag | None
    record: bool = True


@dataclass(slots=True)
class _Execution:
    """The running state of one (possibly nested) workflow execution."""

    outcomes: list[StepOutcome] = field(default_factory=list)
    infra_failure: bool = False
    cost_usd: float = 0.0
    latency_s: float | None = None  # None until some call reports one (replay records none)


def add_latency(total: float | None, more: float | None) -> float | None:
    """Sum latencies where known; unknown (None) stays unknown instead of reading as 0 s."""
    if more is None:
        return total
    return more if total is None else total + more


class RowWriter(Protocol):
    """Where recorded rows go: a `Warehouse`, or anything with its `insert_tables` (training
    rollouts are held in a buffer and written between checkpoints, so a step never waits on the
    warehouse)."""

    def insert_tables(self, batches: Mapping[str, Iterable[Any]]) -> Mapping[str, int]: ...


class CompletionScore(NamedTuple):
    """What one scored conductor completion gave: the reward's inputs."""

    parse_code: str
    correct: bool | None
    final_worker: str | None  # the real name of the worker whose answer is final; None if unparsed


class Orchestrator:
    """Runs workflows on a pool's workers through the governor and records them.

    `workers` maps seat names to Worker objects (every seat except `conductor` seats).
    `warehouse=None` executes without recording (the training reward's scoring path).
    `conductor_policy` is needed only when the pool seats the conductor itself (recursion).
    `predicted_success` (question -> {seat name: P(success)}, e.g. world_model.prompt_predictor)
    fills the recursion prompt's catalogue with W's numbers, as the top-level prompt shows them.
    """

    def __init__(
        self,
        pool: PoolConfig,
        workers: Mapping[str, Worker],
        governor: Governor,
        warehouse: Warehouse | RowWriter | None,
        *,
        include_question: bool = True,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_steps: int = DEFAULT_MAX_STEPS,
        naming: str = "ordinal",
        conductor_policy: ConductorPolicy | None = None,
        conductor_temperature: float = 1.0,
        conductor_max_new_tokens: int = 1024,
        flush_every_rows: int = DEFAULT_FLUSH_EVERY_ROWS,
        predicted_success: Callable[[Question], Mapping[str, float]] | None = None,
    ) -> None:
        if max_depth < 0:
            raise ValueError(f"max_depth must be >= 0, got {max_depth}")
        self.pool = pool
        self.workers = dict(workers)
        self.governor = governor
        self.warehouse = warehouse
        self.include_question = include_question
        self.max_depth = max_depth
        self.max_steps = max_steps
        self.naming = naming
        self.conductor_policy = conductor_policy
        self.conductor_temperature = conductor_temperature
        self.conductor_max_new_tokens = conductor_max_new_tokens
        self.flush_every_rows = flush_every_rows
        self.predicted_success = predicted_success
        self.worker_names: list[str] = pool.worker_names
        self.displayed_names: list[str] = list(displayed_worker_names(self.worker_names, naming))
        self._real_name = dict(zip(self.displayed_names, self.worker_names, strict=True))
        self._conductor_seats = {s.name for s in pool.workers if s.is_conductor}
        missing = [n for n in self.worker_names if n not in self._conductor_seats and n not in self.workers]
        if missing:
            raise ValueError(f"no Worker object for seats {missing} of pool {pool.name!r}")
        if self._conductor_seats and conductor_policy is None:
            raise ValueError(
                f"pool {pool.name!r} seats the conductor ({sorted(self._conductor_seats)}): "
                "recursion needs `conductor_policy`"
            )
        self._pending_calls: list[CallRecord] = []
        self._pending_workflows: list[WorkflowRecord] = []

    # ------------------------------------------------------------------ public entry points

    def parse(
        self, raw_text: str, *, allow_empty: bool = False, shown_workers: Sequence[str] | None = None
    ) -> Workflow:
        """Parse conductor text against the names the conductor saw; steps come back with real names.

        `shown_workers` are the real names a prompt displayed, in order, when it showed a subset of
        the pool (training's randomised pools); by default the whole pool was shown.
        """
        if shown_workers is None:
            displayed_names, real_name = self.displayed_names, self._real_name
        else:
            unknown = [name for name in shown_workers if name not in self.worker_names]
            if unknown:
                raise ValueError(f"shown workers {unknown} are not seats of pool {self.pool.name!r}")
            displayed_names = list(displayed_worker_names(list(shown_workers), self.naming))
            real_name = dict(zip(displayed_names, shown_workers, strict=True))
        displayed = parse_workflow(raw_text, displayed_names, max_steps=self.max_steps, allow_empty=allow_empty)
        return Workflow(
            steps=tuple(Step(worker=real_name[s.worker], subtask=s.subtask, sees=s.sees) for s in displayed.steps)
        )

    async def run_workflow_text(
        self,
        question: Question,
        raw_text: str,
        *,
        conductor_name: str,
        run_id: str,
        arm: str | None = None,
        repeat: int = 0,
        conductor_output: PolicyOutput | None = None,
        workflow_id: str | None = None,
        shown_workers: Sequence[str] | None = None,
        rollout: RolloutTag | None = None,
    ) -> WorkflowRecord:
        """Parse a conductor's output and execute it; an unparseable one is scored wrong (reward 0).

        `shown_workers`: the real names the prompt displayed, when it showed a subset of the pool;
        `rollout`: where a training rollout belongs (its row carries the phase, step and position).
        """
        workflow_id = workflow_id or workflow_key(run_id, arm, repeat, question.question_id, conductor_name)
        if conductor_output is not None:
            self._record_call(
                _conductor_call_record(
                    conductor_output, key=workflow_id, workflow_id=workflow_id, run_id=run_id, question=question,
                    conductor_name=conductor_name, depth=0, sample=repeat, pool=self.pool.name,
                )
            )
        conductor_latency = conductor_output.latency_s if conductor_output is not None else None
        catalogue = list(shown_workers) if shown_workers is not None else list(self.worker_names)
        try:
            workflow = self.parse(raw_text, shown_workers=shown_workers)
        except WorkflowParseError as exc:
            record = WorkflowRecord(
                workflow_id=workflow_id, run_id=run_id, question_id=question.question_id,
                conductor=conductor_name, raw_text=raw_text, parse_code=exc.code, n_steps=0,
                workers=[], final_answer=None, correct=False, cost_usd=0.0,
                latency_s=conductor_latency, arm=arm, repeat=repeat, infra_failure=False, **_rollout_fields(rollout),
                catalogue=catalogue,
            )
            await self._record_workflow(record)
            return record
        return await self.execute(
            question, workflow, run_id=run_id, arm=arm, repeat=repeat, conductor_name=conductor_name,
            raw_text=raw_text, workflow_id=workflow_id, extra_latency_s=conductor_latency, rollout=rollout,
            catalogue=catalogue,
        )

    async def execute(
        self,
        question: Question,
        workflow: Workflow,
        *,
        run_id: str,
        conductor_name: str,
        arm: str | None = None,
        repeat: int = 0,
        raw_text: str | None = None,
        workflow_id: str | None = None,
        extra_latency_s: float | None = None,
        final_step: Callable[[Sequence[StepOutcome]], int] | None = None,
        rollout: RolloutTag | None = None,
        catalogue: Sequence[str] | None = None,
    ) -> WorkflowRecord:
        """Execute an already parsed workflow (steps name real workers) and record it.

        `final_step` picks the step whose answer is the workflow's (default: the last); a
        broadcast-and-vote baseline passes its majority vote. It runs in a thread (it may grade).
        `catalogue`: the workers the conductor that wrote it was shown, in order (None: no conductor).
        """
        workflow_id = workflow_id or workflow_key(run_id, arm, repeat, question.question_id, conductor_name)
        lineage = _Lineage(run_id, workflow_id, conductor_name, arm, repeat, rollout)
        state = await self._execute_steps(question, workflow, workflow_id=workflow_id, lineage=lineage, depth=0)
        if state.infra_failure:
            final_answer, correct = None, None
        else:
            final_answer, correct = await _grade_final(state, question.answer, final_step)
        record = WorkflowRecord(
            workflow_id=workflow_id, run_id=run_id, question_id=question.question_id,
            conductor=conductor_name, raw_text=raw_text, parse_code=PARSE_OK,
            n_steps=len(workflow.steps), workers=[s.worker for s in workflow.steps],
            final_answer=final_answer, correct=correct, cost_usd=state.cost_usd,
            latency_s=add_latency(state.latency_s, extra_latency_s), arm=arm, repeat=repeat,
            infra_failure=state.infra_failure, **_rollout_fields(rollout),
            catalogue=list(catalogue) if catalogue is not None else None,
        )
        await self._record_workflow(record)
        return record

    async def record_not_run(
        self, question: Question, *, conductor_name: str, run_id: str, arm: str | None, repeat: int, error: str
    ) -> WorkflowRecord:
        """A workflow whose conductor never answered (its endpoint failed after retries): an
        infrastructure failure, excluded from scoring, not an unparseable output. The failed
        conductor call is kept in `calls` as `transient`, with the provider's error."""
        workflow_id = workflow_key(run_id, arm, repeat, question.question_id, conductor_name)
        self._record_call(
            CallRecord(
                call_id=stable_id("conductor", workflow_id, 0), run_id=run_id, kind="conductor",
                question_id=question.question_id, worker=conductor_name, sample=repeat, subtask=None, response=None,
                extracted_answer=None, correct=None, status=str(CallStatus.TRANSIENT), error=error[:500],
                prompt_tokens=None, completion_tokens=None, cost_usd=None, latency_s=None, started_at=None,
                pool=self.pool.name, workflow_id=workflow_id, step=None,
            )
        )
        record = WorkflowRecord(
            workflow_id=workflow_id,
            run_id=run_id, question_id=question.question_id, conductor=conductor_name, raw_text=None,
            parse_code=NOT_RUN, n_steps=0, workers=[], final_answer=None, correct=None, cost_usd=0.0,
            latency_s=None, arm=arm, repeat=repeat, infra_failure=True,
        )
        await self._record_workflow(record)
        return record

    async def score_completion(
        self, question: Question, completion_text: str, *, shown_workers: Sequence[str] | None = None
    ) -> CompletionScore:
        """(parse code, correct, final worker) for one conductor completion, recording nothing.

        The GRPO reward's scoring path: `correct` is None when the workflow did not parse or
        hit an infrastructure failure (the caller excludes those rollouts or scores them 0).
        `shown_workers`: the real names the prompt displayed, when it showed a subset of the pool.
        """
        try:
            workflow = self.parse(completion_text, shown_workers=shown_workers)
        except WorkflowParseError as exc:
            return CompletionScore(exc.code, None, None)
        final_worker = workflow.steps[-1].worker
        workflow_id = stable_id("score", question.question_id, completion_text)
        lineage = _Lineage("score", workflow_id, "score", None, 0, None, record=False)
        state = await self._execute_steps(question, workflow, workflow_id=workflow_id, lineage=lineage, depth=0)
        if state.infra_failure:
            return CompletionScore(PARSE_OK, None, final_worker)
        _, correct = await _grade_final(state, question.answer)
        return CompletionScore(PARSE_OK, correct, final_worker)

    async def flush(self) -> None:
        """Write buffered rows: calls first, so a recorded workflow always has its steps."""
        if self.warehouse is None:
            return
        calls, self._pending_calls = self._pending_calls, []
        workflows, self._pending_workflows = self._pending_workflows, []
        if calls or workflows:
            await asyncio.to_thread(self._write, calls, workflows)

    async def aclose(self) -> None:
        """Flush what is buffered; the workers belong to whoever built them."""
        await self.flush()

    # ------------------------------------------------------------------ execution

    async def _execute_steps(
        self,
        question: Question,
        workflow: Workflow,
        *,
        workflow_id: str,
        lineage: _Lineage,
        depth: int,
    ) -> _Execution:
        """Run the steps in order; every call is keyed and recorded under `workflow_id`, the
        workflow it belongs to (a nested one's own id at depth > 0)."""
        state = _Execution()
        for index, step in enumerate(workflow.steps):
            messages = self._step_messages(question, state.outcomes, step)
            seat = self.pool.seat(step.worker)
            if seat.is_conductor:
                result = await self._recurse(
                    question, workflow, state, seat, workflow_id=workflow_id, lineage=lineage, depth=depth, index=index
                )
            else:
                visible = tuple(state.outcomes[seen].response for seen in step.sees)
                result = await self._call_worker(question, seat, messages, lineage.sample, visible)
            graded = await asyncio.to_thread(grade, result.response, question.answer) if lineage.record else None
            state.outcomes.append(
                StepOutcome(
                    index=index, worker=step.worker, subtask=step.subtask, response=result.response,
                    status=result.status, recorded_correct=result.recorded_correct, graded=graded,
                )
            )
            state.cost_usd += result.cost_usd or 0.0
            state.latency_s = add_latency(state.latency_s, result.latency_s)
            if graded is not None:
                correct = None if not result.status.scored else (
                    result.recorded_correct if result.recorded_correct is not None else graded.correct
                )
                self._record_call(
                    _step_call_record(
                        result, key=workflow_id, workflow_id=workflow_id, run_id=lineage.run_id, question=question,
                        step=step, index=index, sample=lineage.sample, extracted=graded.extracted, correct=correct,
                        pool=self.pool.name, visible_steps=len(step.sees),
                        # A conductor step's cost is its inner workflow's, whose calls carry it.
                        cost_usd=None if seat.is_conductor else result.cost_usd,
                    )
                )
            if result.status in INFRA_STATUSES:
                state.infra_failure = True
                break
        if lineage.record:
            await self._maybe_flush()
        return state

    def _step_messages(
        self, question: Question, done: Sequence[StepOutcome], step: Step
    ) -> tuple[ChatMessage, ...]:
        """Earlier visible steps as (user: subtask, assistant: response) turns, then this subtask."""
        messages: list[ChatMessage] = []
        for seen in step.sees:
            earlier = done[seen]
            messages.append(ChatMessage("user", earlier.subtask))
            messages.append(ChatMessage("assistant", earlier.response or ""))
        content = step.subtask
        # A solo arm's subtask *is* the question: showing it twice would change the prompt.
        if self.include_question and step.subtask.strip() != question.problem.strip():
            content = QUESTION_AND_SUBTASK_TEMPLATE.format(question=question.problem, subtask=step.subtask)
        messages.append(ChatMessage("user", content))
        return tuple(messages)

    async def _call_worker(
        self,
        question: Question,
        seat: WorkerSeat,
        messages: tuple[ChatMessage, ...],
        sample: int,
        visible_responses: tuple[str | None, ...] = (),
    ) -> CallResult:
        worker = self.workers[seat.name]
        request = CallRequest(
            question=question, messages=messages, sample=_sample_for(worker, sample),
            temperature=seat.temperature, max_tokens=seat.max_tokens, visible_responses=visible_responses,
        )
        if seat.is_vote:  # no model is called: nothing to hold a slot or rate budget for
            return await worker.call(request)
        async with self.governor.slot(seat.name, estimate_call_tokens(messages, seat.max_tokens)) as lease:
            result = await worker.call(request)
            if result.prompt_tokens is not None or result.completion_tokens is not None:
                lease.report_tokens((result.prompt_tokens or 0) + (result.completion_tokens or 0))
        return result

    async def _recurse(
        self,
        question: Question,
        parent: Workflow,
        state: _Execution,
        seat: WorkerSeat,
        *,
        workflow_id: str,
        lineage: _Lineage,
        depth: int,
        index: int,
    ) -> CallResult:
        """Run the conductor as a step: a new workflow one level down, or pass the answer through.

        Every reply of the conductor becomes a `workflows` row at `depth + 1` (a pass-through has
        no steps; an unparseable reply has its parse code); reaching the cap asks nothing.
        """
        answer_so_far = state.outcomes[-1].response if state.outcomes else None
        passed = CallResult(
            status=CallStatus.OK if answer_so_far is not None else CallStatus.EMPTY,
            response=answer_so_far, latency_s=0.0, cost_usd=0.0,
            recorded_correct=state.outcomes[-1].recorded_correct if state.outcomes else None,
        )
        if depth >= self.max_depth:
            passed.error = f"recursion depth cap {self.max_depth} reached: answer passed through"
            return passed
        assert self.conductor_policy is not None  # checked in __init__
        inner_id = stable_id(workflow_id, "recursion", index)
        inner = _InnerRow(
            question=question, lineage=lineage, workflow_id=inner_id, parent_workflow_id=workflow_id,
            parent_step=index, depth=depth + 1,
        )
        messages = build_recursion_prompt(
            question, self.catalogue(), _render_parent(parent, self.displayed_names, self.worker_names),
            answer_so_far, naming=self.naming, workers_see_question=self.include_question,
            predicted_success=self.predicted_success(question) if self.predicted_success else None,
        )
        try:
            async with self.governor.slot(seat.name, self.conductor_max_new_tokens):
                (output,) = await self.conductor_policy.propose(
                    messages, n=1, temperature=self.conductor_temperature,
                    max_new_tokens=self.conductor_max_new_tokens, seed=recursion_seed(inner_id),
                )
        except PolicyError as exc:
            error = f"conductor policy failed: {exc}"
            await self._record_inner(inner, None, NOT_RUN, infra_failure=True)
            return CallResult(status=CallStatus.TRANSIENT, error=error)
        if lineage.record:
            self._record_call(
                _conductor_call_record(
                    output, key=inner_id, workflow_id=inner_id, run_id=lineage.run_id, question=question,
                    conductor_name=seat.name, depth=depth + 1, sample=lineage.sample, pool=self.pool.name,
                )
            )
        try:
            workflow = self.parse(output.text, allow_empty=True)
        except WorkflowParseError as exc:
            # The conductor failed at its own step: that is a scored failure of this step.
            await self._record_inner(inner, output.text, exc.code, correct=False, latency_s=output.latency_s)
            return CallResult(
                status=CallStatus.TERMINAL, error=f"recursive workflow unparseable: {exc.code}",
                latency_s=output.latency_s, cost_usd=0.0,
            )
        if not workflow.steps:
            passed.latency_s = output.latency_s
            passed.error = "conductor returned three empty lists: answer passed through"
            if lineage.record:
                final_answer, correct = await _grade_final(_Execution(outcomes=state.outcomes[-1:]), question.answer)
                await self._record_inner(
                    inner, output.text, PARSE_OK, final_answer=final_answer, correct=correct, latency_s=output.latency_s
                )
            return passed
        inner_state = await self._execute_steps(question, workflow, workflow_id=inner_id, lineage=lineage, depth=depth + 1)
        latency = add_latency(output.latency_s, inner_state.latency_s)
        if lineage.record:
            final_answer, correct = (None, None) if inner_state.infra_failure else await _grade_final(
                inner_state, question.answer
            )
            await self._record_inner(
                inner, output.text, PARSE_OK, workflow=workflow, final_answer=final_answer, correct=correct,
                cost_usd=inner_state.cost_usd, latency_s=latency, infra_failure=inner_state.infra_failure,
            )
        last = inner_state.outcomes[-1] if inner_state.outcomes else None
        status = CallStatus.TRANSIENT if inner_state.infra_failure else (
            last.status if last is not None else CallStatus.EMPTY
        )
        return CallResult(
            status=status, response=last.response if last is not None else None,
            recorded_correct=last.recorded_correct if last is not None else None,
            cost_usd=inner_state.cost_usd, latency_s=latency,
            error="inner workflow hit an infrastructure failure" if inner_state.infra_failure else None,
        )

    async def _record_inner(
        self,
        inner: _InnerRow,
        raw_text: str | None,
        parse_code: str,
        *,
        workflow: Workflow | None = None,
        final_answer: str | None = None,
        correct: bool | None = None,
        cost_usd: float = 0.0,
        latency_s: float | None = None,
        infra_failure: bool = False,
    ) -> None:
        """The `workflows` row of one reply of the conductor seat (nothing when not recording)."""
        lineage = inner.lineage
        if not lineage.record:
            return
        steps = workflow.steps if workflow is not None else ()
        await self._record_workflow(
            WorkflowRecord(
                workflow_id=inner.workflow_id, run_id=lineage.run_id, question_id=inner.question.question_id,
                conductor=lineage.conductor_name, raw_text=raw_text, parse_code=parse_code, n_steps=len(steps),
                workers=[s.worker for s in steps], final_answer=final_answer, correct=correct, cost_usd=cost_usd,
                latency_s=latency_s, arm=lineage.arm, repeat=lineage.sample, infra_failure=infra_failure,
                parent_workflow_id=inner.parent_workflow_id, parent_step=inner.parent_step, depth=inner.depth,
                root_workflow_id=lineage.root_workflow_id, **_rollout_fields(lineage.rollout),
                catalogue=list(self.worker_names),  # the recursion prompt lists the whole pool
            )
        )

    def catalogue(self) -> list[CatalogueEntry]:
        """The pool's seats (real names, descriptions); the prompt builders apply the naming."""
        return catalogue_from_pool(self.pool)

    # ------------------------------------------------------------------ recording

    def _record_call(self, row: CallRecord) -> None:
        if self.warehouse is not None:
            self._pending_calls.append(row)

    async def _record_workflow(self, row: WorkflowRecord) -> None:
        if self.warehouse is not None:
            self._pending_workflows.append(row)
            await self._maybe_flush()

    async def _maybe_flush(self) -> None:
        if len(self._pending_calls) + len(self._pending_workflows) >= self.flush_every_rows:
            await self.flush()

    def _write(self, calls: list[CallRecord], workflows: list[WorkflowRecord]) -> None:
        assert self.warehouse is not None
        # One transaction: a workflow and its calls land together.
        self.warehouse.insert_tables({"calls": calls, "workflows": workflows})


# ---------------------------------------------------------------------- helpers


def workflow_key(run_id: str, arm: str | None, repeat: int, question_id: str, conductor_name: str) -> str:
    """The workflow id: stable, so a rerun of the same run writes (and skips) the same keys."""
    return stable_id("workflow", run_id, arm, repeat, question_id, conductor_name)


def recursion_seed(inner_workflow_id: str) -> int:
    """The sampling seed of the conductor's reply at a recursive step: fixed by where it is asked."""
    return int(inner_workflow_id[:8], 16)


@dataclass(frozen=True, slots=True)
class _InnerRow:
    """Where a nested workflow sits: its id, the step that called it and its depth."""

    question: Question
    lineage: _Lineage
    workflow_id: str
    parent_workflow_id: str
    parent_step: int
    depth: int


def _rollout_fields(rollout: RolloutTag | None) -> dict[str, object]:
    """The `workflows` columns of a training rollout (none for an evaluation workflow)."""
    if rollout is None:
        return {}
    return {"phase": rollout.phase, "training_step": rollout.training_step, "rollout": rollout.rollout}


def one_step_workflow(worker: str, question: Question) -> Workflow:
    """The workflow of a solo arm or a router: one worker, the question itself as the subtask."""
    return Workflow(steps=(Step(worker=worker, subtask=question.problem, sees=()),))


def _sample_for(worker: Worker, repeat: int) -> int:
    """The recorded sample a repeat replays; a one-recording source replays its only sample.

    Live workers sample anew on every call whatever the index; replay seats hold a fixed number
    of recordings, and asking past them would turn every later repeat into `not_recorded`.
    """
    if isinstance(worker, RecordedWorker) and worker.samples_recorded > 0:
        return repeat % worker.samples_recorded
    return repeat


async def _grade_final(
    state: _Execution, gold: str, final_step: Callable[[Sequence[StepOutcome]], int] | None = None
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


def _render_parent(parent: Workflow, displayed: Sequence[str], real: Sequence[str]) -> Workflow:
    """The parent workflow as the conductor wrote it: with the names it saw."""
    shown = dict(zip(real, displayed, strict=True))
    return Workflow(steps=tuple(Step(worker=shown[s.worker], subtask=s.subtask, sees=s.sees) for s in parent.steps))


def _step_call_record(
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


def _conductor_call_record(
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
