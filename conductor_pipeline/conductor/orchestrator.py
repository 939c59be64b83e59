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
it takes no governor slot. A vote seat with `stop_when_first_agree` ends the spending early: when the
first steps it sees agree, the steps before it that have not run are skipped. Each step's `calls`
row records how many earlier results it saw (`visible_steps`), the world model's topology feature.

Recursion (a pool seat with backend `conductor` is the conductor itself): `conductor.recursion`.
The execution state and the rows it records: `conductor.execution`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from conductor_pipeline.conductor.execution import (
    INFRA_STATUSES,
    NOT_RUN,
    CompletionScore,
    Execution,
    Lineage,
    StepOutcome,
    add_latency,
    agreement_steps,
    all_agree,
    conductor_call_record,
    grade_final,
    rollout_fields,
    sample_for,
    step_call_record,
    step_messages,
    workflow_key,
)
from conductor_pipeline.conductor.prompt import (
    CatalogueEntry,
    catalogue_from_pool,
    displayed_worker_names,
)
from conductor_pipeline.conductor.protocols import ConductorPolicy, PolicyOutput
from conductor_pipeline.conductor.recursion import DEFAULT_MAX_DEPTH, RecursiveSteps
from conductor_pipeline.grading import grade
from conductor_pipeline.pools.backends.base import Worker
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

# Rows are buffered and written in batches: one warehouse transaction per workflow would hold
# the inter-process lock thousands of times per evaluation.
DEFAULT_FLUSH_EVERY_ROWS = 2000


class RowWriter(Protocol):
    """Where recorded rows go: a `Warehouse`, or anything with its `insert_tables` (training
    rollouts are held in a buffer and written between checkpoints, so a step never waits on the
    warehouse)."""

    def insert_tables(self, batches: Mapping[str, Iterable[Any]]) -> Mapping[str, int]: ...


class Orchestrator(RecursiveSteps):
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
                conductor_call_record(
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
                latency_s=conductor_latency, arm=arm, repeat=repeat, infra_failure=False, **rollout_fields(rollout),
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
        stop_after: Callable[[Sequence[StepOutcome]], bool] | None = None,
        rollout: RolloutTag | None = None,
        catalogue: Sequence[str] | None = None,
    ) -> WorkflowRecord:
        """Execute an already parsed workflow (steps name real workers) and record it.

        `final_step` picks the step whose answer is the workflow's (default: the last); a
        broadcast-and-vote baseline passes its majority vote. It runs in a thread (it may grade).
        `stop_after`, asked after each step but the last, ends the workflow there when it says so
        (an agreement cascade stops once enough answers agree); the record then lists the steps
        that ran, and their calls are all it paid for.
        `catalogue`: the workers the conductor that wrote it was shown, in order (None: no conductor).
        """
        workflow_id = workflow_id or workflow_key(run_id, arm, repeat, question.question_id, conductor_name)
        lineage = Lineage(run_id, workflow_id, conductor_name, arm, repeat, rollout)
        state = await self._execute_steps(
            question, workflow, workflow_id=workflow_id, lineage=lineage, depth=0, stop_after=stop_after
        )
        if state.infra_failure:
            final_answer, correct = None, None
        else:
            final_answer, correct = await grade_final(state, question.answer, final_step)
        steps = (
            tuple(workflow.steps[outcome.index] for outcome in state.outcomes)
            if state.stopped_early or state.skipped else workflow.steps
        )
        record = WorkflowRecord(
            workflow_id=workflow_id, run_id=run_id, question_id=question.question_id,
            conductor=conductor_name, raw_text=raw_text, parse_code=PARSE_OK,
            n_steps=len(steps), workers=[s.worker for s in steps],
            final_answer=final_answer, correct=correct, cost_usd=state.cost_usd,
            latency_s=add_latency(state.latency_s, extra_latency_s), arm=arm, repeat=repeat,
            infra_failure=state.infra_failure, **rollout_fields(rollout),
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
        lineage = Lineage("score", workflow_id, "score", None, 0, None, record=False)
        state = await self._execute_steps(question, workflow, workflow_id=workflow_id, lineage=lineage, depth=0)
        if state.infra_failure:
            return CompletionScore(PARSE_OK, None, final_worker)
        _, correct = await grade_final(state, question.answer)
        return CompletionScore(PARSE_OK, correct, final_worker)

    async def flush(self, *, unfinished: bool = False) -> None:
        """Write buffered rows, each workflow with its calls in one transaction (every call is
        recorded before its workflow). The calls of a workflow still running stay buffered until it
        is recorded: a kill must not leave an unfinished workflow's steps behind, because a rerun
        runs that workflow again under the same call keys, and the first attempt's rows would win
        over the rerun's. `unfinished` writes those calls too (the last flush: nothing that was paid
        for is dropped)."""
        if self.warehouse is None:
            return
        workflows, self._pending_workflows = self._pending_workflows, []
        finished = {w.workflow_id for w in workflows}
        calls, held = [], []
        for call in self._pending_calls:
            ready = unfinished or call.workflow_id is None or call.workflow_id in finished
            (calls if ready else held).append(call)
        self._pending_calls = held
        if calls or workflows:
            await asyncio.to_thread(self._write, calls, workflows)

    async def aclose(self) -> None:
        """Flush what is buffered, unfinished workflows' calls included; the workers belong to
        whoever built them."""
        await self.flush(unfinished=True)

    # ------------------------------------------------------------------ execution

    async def _execute_steps(
        self,
        question: Question,
        workflow: Workflow,
        *,
        workflow_id: str,
        lineage: Lineage,
        depth: int,
        stop_after: Callable[[Sequence[StepOutcome]], bool] | None = None,
    ) -> Execution:
        """Run the steps in order; every call is keyed and recorded under `workflow_id`, the
        workflow it belongs to (a nested one's own id at depth > 0). `stop_after` (see `execute`)
        may end the run before the last step."""
        state = Execution()
        agreement = agreement_steps(workflow, self.pool.seat(workflow.steps[-1].worker).stop_when_first_agree)
        for index, step in enumerate(workflow.steps):
            if index in state.skipped:
                continue
            seen = state.seen_by(step)
            messages = step_messages(question, seen, step, include_question=self.include_question)
            seat = self.pool.seat(step.worker)
            if seat.is_conductor:
                result = await self._recurse(
                    question, workflow, state, seat, workflow_id=workflow_id, lineage=lineage, depth=depth, index=index
                )
            else:
                visible = tuple(outcome.response for outcome in seen)
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
                    step_call_record(
                        result, key=workflow_id, workflow_id=workflow_id, run_id=lineage.run_id, question=question,
                        step=step, index=index, sample=lineage.sample, extracted=graded.extracted, correct=correct,
                        pool=self.pool.name, visible_steps=len(seen),
                        # A conductor step's cost is its inner workflow's, whose calls carry it.
                        cost_usd=None if seat.is_conductor else result.cost_usd,
                    )
                )
            if result.status in INFRA_STATUSES:
                state.infra_failure = True
                break
            if agreement is not None and index == agreement[-1] and await asyncio.to_thread(
                all_agree, [outcome.response for outcome in map(state.outcome_of, agreement) if outcome]
            ):
                state.skipped = frozenset(range(index + 1, len(workflow.steps) - 1))
            more_to_run = index < len(workflow.steps) - 1
            if stop_after is not None and more_to_run and await asyncio.to_thread(stop_after, tuple(state.outcomes)):
                state.stopped_early = True
                break
        if lineage.record:
            await self._maybe_flush()
        return state

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
            question=question, messages=messages, sample=sample_for(worker, sample),
            temperature=seat.temperature, max_tokens=seat.max_tokens, visible_responses=visible_responses,
        )
        if seat.is_vote:  # no model is called: nothing to hold a slot or rate budget for
            return await worker.call(request)
        async with self.governor.slot(seat.name, estimate_call_tokens(messages, seat.max_tokens)) as lease:
            result = await worker.call(request)
            if result.prompt_tokens is not None or result.completion_tokens is not None:
                lease.report_tokens((result.prompt_tokens or 0) + (result.completion_tokens or 0))
        return result

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
