"""Recursion: a pool seat with backend `conductor` is the conductor itself.

Such a step prompts the conductor again with the parent workflow and the answer so far; its reply
is either a new workflow (executed one level deeper; its answer becomes the step's answer) or three
empty lists (pass the answer through). Depth is capped so a policy cannot recurse forever. Each
reply is a `workflows` row of its own (linked to the calling workflow, step and the top-level
workflow, with its depth) whose step calls carry its id, so what recursion did can be read back per
level; the calling step's own `calls` row carries no cost, since the inner calls carry it. The inner
conductor samples with a seed drawn from the inner workflow's id, so a rerun writes the same rows.

`RecursiveSteps` is the part of `conductor.orchestrator.Orchestrator` that runs such steps; it uses
the orchestrator's pool, governor, conductor policy, parser, step execution and row recording.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conductor_pipeline.conductor.execution import (
    NOT_RUN,
    Execution,
    Lineage,
    add_latency,
    conductor_call_record,
    grade_final,
    rollout_fields,
)
from conductor_pipeline.conductor.prompt import build_recursion_prompt
from conductor_pipeline.conductor.protocols import PolicyError, PolicyOutput
from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.records import CallResult, CallStatus, Question, WorkflowRecord, stable_id
from conductor_pipeline.workflow import PARSE_OK, Step, Workflow, WorkflowParseError

# The paper caps recursion; two levels already let a conductor fix its own first plan.
DEFAULT_MAX_DEPTH = 2


def recursion_seed(inner_workflow_id: str) -> int:
    """The sampling seed of the conductor's reply at a recursive step: fixed by where it is asked."""
    return int(inner_workflow_id[:8], 16)


@dataclass(frozen=True, slots=True)
class InnerRow:
    """Where a nested workflow sits: its id, the step that called it and its depth."""

    question: Question
    lineage: Lineage
    workflow_id: str
    parent_workflow_id: str
    parent_step: int
    depth: int


def render_parent(parent: Workflow, displayed: Sequence[str], real: Sequence[str]) -> Workflow:
    """The parent workflow as the conductor wrote it: with the names it saw."""
    shown = dict(zip(real, displayed, strict=True))
    return Workflow(steps=tuple(Step(worker=shown[s.worker], subtask=s.subtask, sees=s.sees) for s in parent.steps))


class RecursiveSteps:
    """The conductor-seat steps of an `Orchestrator` (which this class is a base of)."""

    async def _recurse(
        self,
        question: Question,
        parent: Workflow,
        state: Execution,
        seat: WorkerSeat,
        *,
        workflow_id: str,
        lineage: Lineage,
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
        inner_id = stable_id(workflow_id, "recursion", index)
        inner = InnerRow(
            question=question, lineage=lineage, workflow_id=inner_id, parent_workflow_id=workflow_id,
            parent_step=index, depth=depth + 1,
        )
        try:
            output = await self._ask_conductor(question, parent, answer_so_far, seat, inner)
        except PolicyError as exc:
            error = f"conductor policy failed: {exc}"
            await self._record_inner(inner, None, NOT_RUN, infra_failure=True)
            return CallResult(status=CallStatus.TRANSIENT, error=error)
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
                final_answer, correct = await grade_final(Execution(outcomes=state.outcomes[-1:]), question.answer)
                await self._record_inner(
                    inner, output.text, PARSE_OK, final_answer=final_answer, correct=correct, latency_s=output.latency_s
                )
            return passed
        return await self._run_inner(question, workflow, output, inner)

    async def _ask_conductor(
        self, question: Question, parent: Workflow, answer_so_far: str | None, seat: WorkerSeat, inner: InnerRow
    ) -> PolicyOutput:
        """The conductor's reply at a recursive step, sampled with the seed its place fixes, and its
        `calls` row (when recording); PolicyError when the policy fails."""
        assert self.conductor_policy is not None  # checked in Orchestrator.__init__
        messages = build_recursion_prompt(
            question, self.catalogue(), render_parent(parent, self.displayed_names, self.worker_names),
            answer_so_far, naming=self.naming, workers_see_question=self.include_question,
            predicted_success=self.predicted_success(question) if self.predicted_success else None,
        )
        async with self.governor.slot(seat.name, self.conductor_max_new_tokens):
            (output,) = await self.conductor_policy.propose(
                messages, n=1, temperature=self.conductor_temperature,
                max_new_tokens=self.conductor_max_new_tokens, seed=recursion_seed(inner.workflow_id),
            )
        lineage = inner.lineage
        if lineage.record:
            self._record_call(
                conductor_call_record(
                    output, key=inner.workflow_id, workflow_id=inner.workflow_id, run_id=lineage.run_id,
                    question=question, conductor_name=seat.name, depth=inner.depth, sample=lineage.sample,
                    pool=self.pool.name,
                )
            )
        return output

    async def _run_inner(
        self, question: Question, workflow: Workflow, output: PolicyOutput, inner: InnerRow
    ) -> CallResult:
        """Execute the conductor's new workflow one level down; its last step's answer is the
        calling step's, its cost and latency (with the reply's) the step's."""
        lineage = inner.lineage
        inner_state = await self._execute_steps(
            question, workflow, workflow_id=inner.workflow_id, lineage=lineage, depth=inner.depth
        )
        latency = add_latency(output.latency_s, inner_state.latency_s)
        if lineage.record:
            final_answer, correct = (None, None) if inner_state.infra_failure else await grade_final(
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
        inner: InnerRow,
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
                root_workflow_id=lineage.root_workflow_id, **rollout_fields(lineage.rollout),
                catalogue=list(self.worker_names),  # the recursion prompt lists the whole pool
            )
        )
