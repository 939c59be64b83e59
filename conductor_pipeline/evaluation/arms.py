"""Eval arms (each worker solo, routers, broadcast-and-vote, conductors) run through the orchestrator.

An arm's name is what its class says it is (`SoloArm.PREFIX` + worker, a router's `name`,
`VoteArm.PREFIX` + label, `ConductorArm.PREFIX` + label): the warehouse rows, the run id and the
tables all use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from conductor_pipeline.conductor.orchestrator import Orchestrator, one_step_workflow, workflow_key
from conductor_pipeline.conductor.policies import ConductorPolicy, PolicyError
from conductor_pipeline.conductor.prompt import build_conductor_prompt
from conductor_pipeline.evaluation.routers import OracleRouter
from conductor_pipeline.evaluation.vote import majority_step
from conductor_pipeline.records import Question, WorkflowRecord, stable_id
from conductor_pipeline.workflow import Step, Workflow

# Workflows in flight at once per evaluation; the governor bounds the calls, this bounds memory.
DEFAULT_MAX_CONCURRENT_WORKFLOWS = 64


# ---------------------------------------------------------------------- arms


class Router(Protocol):
    name: str

    def route(self, question: Question, repeat: int = 0) -> Workflow: ...


class Arm(Protocol):
    """One row of the arm table: something that answers a question through the orchestrator."""

    name: str

    async def answer(
        self, orchestrator: Orchestrator, question: Question, *, run_id: str, repeat: int
    ) -> WorkflowRecord: ...


@dataclass(frozen=True)
class SoloArm:
    """One worker alone: a one-step workflow with the question as the subtask."""

    worker: str
    PREFIX: ClassVar[str] = "solo:"

    @property
    def name(self) -> str:
        return f"{self.PREFIX}{self.worker}"

    async def answer(self, orchestrator: Orchestrator, question: Question, *, run_id: str, repeat: int) -> WorkflowRecord:
        return await orchestrator.execute(
            question, one_step_workflow(self.worker, question), run_id=run_id,
            conductor_name=self.name, arm=self.name, repeat=repeat,
        )


@dataclass(frozen=True)
class RouterArm:
    """A model-free baseline router; its one-step workflow runs like any other."""

    router: Router

    @property
    def name(self) -> str:
        return self.router.name

    async def answer(self, orchestrator: Orchestrator, question: Question, *, run_id: str, repeat: int) -> WorkflowRecord:
        return await orchestrator.execute(
            question, self.router.route(question, repeat), run_id=run_id,
            conductor_name=self.name, arm=self.name, repeat=repeat,
        )


@dataclass(frozen=True)
class OracleArm:
    """The oracle router as an arm, before the solo arms have run.

    Its name is known up front (it keys the run), its routes are not: the oracle routes on the
    solo arms' verdicts, so it answers only as the RouterArm that `with_solo_verdicts` returns.
    `fallback` answers questions nobody solved solo (the best single worker).
    """

    fallback: str
    name: ClassVar[str] = OracleRouter.name

    def with_solo_verdicts(self, solo_correct: Mapping[str, Mapping[str, bool]]) -> RouterArm:
        return RouterArm(OracleRouter(solo_correct, fallback=self.fallback))

    async def answer(self, orchestrator: Orchestrator, question: Question, *, run_id: str, repeat: int) -> WorkflowRecord:
        raise RuntimeError("the oracle arm routes on the solo arms' verdicts: run `with_solo_verdicts(...)` instead")


@dataclass(frozen=True)
class VoteArm:
    """Broadcast and vote: every listed worker answers the question alone, and the majority of their
    extracted answers is the arm's answer (`vote.majority_step`; ties to the best-ranked worker).

    `workers` are in rank order, best first on the train split. Each answer is a recorded step
    call, so the arm's cost and tokens are the sums of the calls it made.
    """

    label: str
    workers: tuple[str, ...]
    PREFIX: ClassVar[str] = "vote:"

    def __post_init__(self) -> None:
        if len(self.workers) < 2:
            raise ValueError(f"a vote needs at least two workers, got {list(self.workers)}")

    @property
    def name(self) -> str:
        return f"{self.PREFIX}{self.label}"

    async def answer(self, orchestrator: Orchestrator, question: Question, *, run_id: str, repeat: int) -> WorkflowRecord:
        broadcast = Workflow(steps=tuple(Step(worker=w, subtask=question.problem, sees=()) for w in self.workers))
        return await orchestrator.execute(
            question, broadcast, run_id=run_id, conductor_name=self.name, arm=self.name, repeat=repeat,
            final_step=majority_step,
        )


@dataclass(frozen=True)
class ConductorArm:
    """A conductor policy: prompt -> workflow text -> orchestrator.

    `predicted_success` (question -> {seat name: P(success)}; world_model.prompt_predictor of a
    TRAIN-split W) puts W's numbers next to the catalogue; None shows none. The prompt's rules say
    what workers see according to the orchestrator's `include_question`.
    """

    label: str
    policy: ConductorPolicy
    naming: str = "ordinal"
    examples: Sequence[object] = ()
    temperature: float = 1.0
    max_new_tokens: int = 1024
    seed: int = 0
    predicted_success: Callable[[Question], Mapping[str, float]] | None = None
    PREFIX: ClassVar[str] = "conductor:"

    @property
    def name(self) -> str:
        return f"{self.PREFIX}{self.label}"

    def prompt(self, orchestrator: Orchestrator, question: Question) -> list[dict[str, str]]:
        """The chat messages this arm sends its policy for a question."""
        return build_conductor_prompt(
            question, orchestrator.catalogue(), naming=self.naming, examples=list(self.examples),
            predicted_success=self.predicted_success(question) if self.predicted_success else None,
            workers_see_question=orchestrator.include_question,
        )

    async def answer(self, orchestrator: Orchestrator, question: Question, *, run_id: str, repeat: int) -> WorkflowRecord:
        messages = self.prompt(orchestrator, question)
        seed = int(stable_id(self.seed, question.question_id, repeat)[:8], 16)
        try:
            (output,) = await self.policy.propose(
                messages, n=1, temperature=self.temperature, max_new_tokens=self.max_new_tokens, seed=seed
            )
        except PolicyError as exc:
            return await orchestrator.record_not_run(
                question, conductor_name=self.name, run_id=run_id, arm=self.name, repeat=repeat, error=str(exc)
            )
        return await orchestrator.run_workflow_text(
            question, output.text, conductor_name=self.name, run_id=run_id, arm=self.name, repeat=repeat,
            conductor_output=output,
        )


async def run_arm(
    orchestrator: Orchestrator,
    arm: Arm,
    questions: Sequence[Question],
    *,
    run_id: str,
    repeats: int = 1,
    skip_workflow_ids: frozenset[str] = frozenset(),
    max_concurrent: int = DEFAULT_MAX_CONCURRENT_WORKFLOWS,
) -> list[WorkflowRecord]:
    """Every (question, repeat) of one arm, concurrently; already recorded workflows are skipped.

    Skipping by workflow id makes a rerun after a crash continue where it stopped.
    """
    gate = asyncio.Semaphore(max_concurrent)

    async def one(question: Question, repeat: int) -> WorkflowRecord | None:
        if workflow_key(run_id, arm.name, repeat, question.question_id, arm.name) in skip_workflow_ids:
            return None
        async with gate:
            return await arm.answer(orchestrator, question, run_id=run_id, repeat=repeat)

    results = await asyncio.gather(*(one(q, r) for r in range(repeats) for q in questions))
    await orchestrator.flush()
    return [r for r in results if r is not None]


@dataclass(frozen=True)
class EvalRunSummary:
    """What `eval_arms` hands to `eval_tables`: enough to find and check its rows."""

    run_id: str
    corpus: str
    slice_ids: tuple[str, ...]
    planned_size: int
    split_fingerprint: str
    repeats: int
    arms: tuple[str, ...]
    best_single_worker: str | None = None
    calibration_question_ids: tuple[str, ...] = ()
    training_question_ids: tuple[str, ...] = ()
    extra: Mapping[str, object] = field(default_factory=dict)
