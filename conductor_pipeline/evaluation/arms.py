"""Eval arms (each worker solo, routers, broadcast-and-vote, conductors) run through the orchestrator.

An arm's name is what its class says it is (`SoloArm.PREFIX` + worker, a router's `name`,
`VoteArm.PREFIX` + label, `ConductorArm.PREFIX` + label): the warehouse rows, the run id and the
tables all use it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar, Literal, Protocol

from conductor_pipeline.conductor.execution import broadcast_workflow, one_step_workflow, workflow_key
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.conductor.prompt import build_conductor_prompt, rank_by_predicted_success
from conductor_pipeline.conductor.protocols import BatchingPolicy, ConductorPolicy, PolicyError, PolicyOutput
from conductor_pipeline.evaluation.routers import OracleRouter
from conductor_pipeline.evaluation.routing_predictions import RoutingPredictions
from conductor_pipeline.evaluation.vote import majority_step
from conductor_pipeline.records import Question, WorkflowRecord, stable_id
from conductor_pipeline.workflow import Workflow

# Workflows in flight at once per evaluation; the governor bounds the calls, this bounds memory.
DEFAULT_MAX_CONCURRENT_WORKFLOWS = 64
# How a conductor arm lists the pool: in the pool file's order, or shuffled per question.
CatalogueOrder = Literal["pool", "shuffled"]
CATALOGUE_ORDERS: tuple[CatalogueOrder, ...] = ("pool", "shuffled")


def shuffled_catalogue(workers: Sequence[str], question_id: str, seed: int) -> list[str]:
    """`workers` in an order fixed by the question and the seed, different across questions."""
    order = list(workers)
    random.Random(stable_id("catalogue", seed, question_id)).shuffle(order)
    return order


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
        broadcast = broadcast_workflow(self.workers, question)
        return await orchestrator.execute(
            question, broadcast, run_id=run_id, conductor_name=self.name, arm=self.name, repeat=repeat,
            final_step=majority_step,
        )


@dataclass(frozen=True)
class ConductorArm:
    """A conductor policy: prompt -> workflow text -> orchestrator.

    `predicted_success` (question -> {seat name: P(success)}; world_model.prompt_predictor of a
    TRAIN-split W) puts W's numbers next to the catalogue; None shows none. The prompt's rules say
    what workers see according to the orchestrator's `include_question`. `recursive`: the pool
    seats the conductor, so its workflows may call this policy again; the name says so, since the
    same policy on the same workers without that seat is another arm. `ranked` lists the workers by
    those numbers, highest first (ties in the pool's or the shuffled order), as a policy trained on
    ranked catalogues was prompted.
    """

    label: str
    policy: ConductorPolicy
    naming: str = "ordinal"
    examples: Sequence[object] = ()
    temperature: float = 1.0
    max_new_tokens: int = 1024
    seed: int = 0
    predicted_success: Callable[[Question], Mapping[str, float]] | None = None
    recursive: bool = False
    catalogue_order: CatalogueOrder = "pool"
    catalogue_seed: int = 0
    ranked: bool = False
    # question id -> W's numbers: the prompt and the parse of one answer read them once.
    _predicted: dict[str, Mapping[str, float]] = field(default_factory=dict, init=False, repr=False, compare=False)
    PREFIX: ClassVar[str] = "conductor:"
    RECURSIVE_SUFFIX: ClassVar[str] = "+recursive"
    SHUFFLED_SUFFIX: ClassVar[str] = "@shuffled"

    @property
    def name(self) -> str:
        order = self.SHUFFLED_SUFFIX if self.catalogue_order == "shuffled" else ""
        return f"{self.PREFIX}{self.label}{order}{self.RECURSIVE_SUFFIX if self.recursive else ''}"

    def __post_init__(self) -> None:
        if self.ranked and self.predicted_success is None:
            raise ValueError(f"{self.label}: a ranked catalogue is ordered by W's numbers: give predicted_success")

    def predictions(self, question: Question) -> Mapping[str, float] | None:
        """W's numbers for the question's prompt (computed once per question), or None."""
        if self.predicted_success is None:
            return None
        if question.question_id not in self._predicted:
            self._predicted[question.question_id] = self.predicted_success(question)
        return self._predicted[question.question_id]

    def shown_workers(self, orchestrator: Orchestrator, question: Question) -> list[str] | None:
        """The catalogue order this arm shows for a question: None for the pool file's order; with
        `catalogue_order="shuffled"`, a permutation of the pool fixed by the question and
        `catalogue_seed` (so every shuffled arm of a run sees the same order for the same question);
        `ranked`, that order sorted by W's numbers."""
        if self.catalogue_order == "pool" and not self.ranked:
            return None
        shown = (
            list(orchestrator.worker_names) if self.catalogue_order == "pool"
            else shuffled_catalogue(orchestrator.worker_names, question.question_id, self.catalogue_seed)
        )
        return rank_by_predicted_success(shown, self.predictions(question) or {}) if self.ranked else shown

    def prompt(self, orchestrator: Orchestrator, question: Question) -> list[dict[str, str]]:
        """The chat messages this arm sends its policy for a question."""
        entries = {entry.name: entry for entry in orchestrator.catalogue()}
        shown = self.shown_workers(orchestrator, question) or list(entries)
        return build_conductor_prompt(
            question, [entries[name] for name in shown], naming=self.naming, examples=list(self.examples),
            predicted_success=self.predictions(question), workers_see_question=orchestrator.include_question,
        )

    def sampling_seed(self, question: Question, repeat: int) -> int:
        """The seed of the arm's sample for one (question, repeat): fixed, so a rerun draws the same text."""
        return int(stable_id(self.seed, question.question_id, repeat)[:8], 16)

    async def answer(self, orchestrator: Orchestrator, question: Question, *, run_id: str, repeat: int) -> WorkflowRecord:
        messages = self.prompt(orchestrator, question)
        try:
            (output,) = await self.policy.propose(
                messages, n=1, temperature=self.temperature, max_new_tokens=self.max_new_tokens,
                seed=self.sampling_seed(question, repeat),
            )
        except PolicyError as exc:
            return await self._not_run(orchestrator, question, run_id=run_id, repeat=repeat, error=str(exc))
        return await self._run(orchestrator, question, output, run_id=run_id, repeat=repeat)

    async def answer_batch(
        self,
        orchestrator: Orchestrator,
        batch: Sequence[tuple[Question, int]],
        *,
        run_id: str,
        max_concurrent: int,
        recorded: Collection[tuple[str, int]] = (),
    ) -> list[WorkflowRecord]:
        """Every (question, repeat) of `batch` but the `recorded` (question id, repeat) pairs, one
        `answer` each, `max_concurrent` at a time: for a policy that does not batch (a batching one
        goes through `generate_batch` and `run_generated`)."""
        gate = asyncio.Semaphore(max_concurrent)

        async def one(question: Question, repeat: int) -> WorkflowRecord:
            async with gate:
                return await self.answer(orchestrator, question, run_id=run_id, repeat=repeat)

        return list(await asyncio.gather(*(one(q, r) for q, r in batch if (q.question_id, r) not in recorded)))

    async def generate_batch(
        self, orchestrator: Orchestrator, batch: Sequence[tuple[Question, int]]
    ) -> list[PolicyOutput] | PolicyError:
        """The workflow texts of the whole batch from a batching policy, in one call; a policy
        fault is returned, for `run_generated` to record against every workflow of the batch.

        Recorded rows are generated too: a batch's texts are the same for the same batch, but a
        smaller batch pads and multiplies in other shapes, and at temperature 1 a last-bit
        difference in the scores can change a sampled token; a run resumed after a kill must draw
        what the uninterrupted run drew.
        """
        if not isinstance(self.policy, BatchingPolicy):
            raise TypeError(f"{self.name}: policy {type(self.policy).__name__} does not generate batches")
        try:
            return await self.policy.propose_batch(
                [self.prompt(orchestrator, q) for q, _ in batch], temperature=self.temperature,
                max_new_tokens=self.max_new_tokens, seeds=[self.sampling_seed(q, r) for q, r in batch],
            )
        except PolicyError as exc:
            return exc

    async def run_generated(
        self,
        orchestrator: Orchestrator,
        batch: Sequence[tuple[Question, int]],
        generated: list[PolicyOutput] | PolicyError,
        *,
        run_id: str,
        max_concurrent: int,
        recorded: Collection[tuple[str, int]] = (),
    ) -> list[WorkflowRecord]:
        """The workflows of `batch` but the `recorded` ones, from `generate_batch`'s texts."""
        pending = [(q, r) for q, r in batch if (q.question_id, r) not in recorded]
        if isinstance(generated, PolicyError):
            return [
                await self._not_run(orchestrator, q, run_id=run_id, repeat=r, error=str(generated)) for q, r in pending
            ]
        gate = asyncio.Semaphore(max_concurrent)

        async def run(question: Question, repeat: int, output: PolicyOutput) -> WorkflowRecord:
            async with gate:
                return await self._run(orchestrator, question, output, run_id=run_id, repeat=repeat)

        return list(await asyncio.gather(*(
            run(q, r, o) for (q, r), o in zip(batch, generated, strict=True) if (q.question_id, r) not in recorded
        )))

    async def _run(
        self, orchestrator: Orchestrator, question: Question, output: PolicyOutput, *, run_id: str, repeat: int
    ) -> WorkflowRecord:
        return await orchestrator.run_workflow_text(
            question, output.text, conductor_name=self.name, run_id=run_id, arm=self.name, repeat=repeat,
            conductor_output=output, shown_workers=self.shown_workers(orchestrator, question),
        )

    async def _not_run(
        self, orchestrator: Orchestrator, question: Question, *, run_id: str, repeat: int, error: str
    ) -> WorkflowRecord:
        return await orchestrator.record_not_run(
            question, conductor_name=self.name, run_id=run_id, arm=self.name, repeat=repeat, error=error
        )


async def _run_generated_groups(
    orchestrator: Orchestrator,
    arm: ConductorArm,
    groups: Sequence[tuple[Sequence[tuple[Question, int]], Collection[tuple[str, int]]]],
    *,
    run_id: str,
    max_concurrent: int,
) -> list[WorkflowRecord]:
    """A batching arm's groups: each generated whole (`generate_batch`), then its workflows run and
    are written. The policy generates the next group in its worker thread while a group's
    workflows run, so the model does not wait on the workers and the warehouse; a recursive arm,
    whose workflows call the policy themselves, generates each group after the last is written."""
    ahead = not arm.recursive

    def generate(index: int) -> asyncio.Future[list[PolicyOutput] | PolicyError] | None:
        return asyncio.ensure_future(arm.generate_batch(orchestrator, groups[index][0])) if index < len(groups) else None

    records: list[WorkflowRecord] = []
    upcoming = generate(0)
    try:
        for index, (group, recorded) in enumerate(groups):
            generated = await upcoming
            upcoming = generate(index + 1) if ahead else None
            records += await arm.run_generated(
                orchestrator, group, generated, run_id=run_id, max_concurrent=max_concurrent, recorded=recorded
            )
            await orchestrator.flush()
            if not ahead:
                upcoming = generate(index + 1)
    finally:
        if upcoming is not None and not upcoming.done():
            upcoming.cancel()
    return records


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

    Skipping by workflow id makes a rerun after a crash continue where it stopped. A conductor arm
    generates `max_concurrent` questions' workflows at a time (one batch where its policy batches),
    and each group's rows are written before the next group's workflows start. The groups are cut
    from every (question, repeat), recorded or not, so a resumed run generates the batches an
    uninterrupted one did (`ConductorArm.generate_batch`); a group with nothing left to record is
    not generated (`_run_generated_groups`).
    """
    def is_recorded(question: Question, repeat: int) -> bool:
        return workflow_key(run_id, arm.name, repeat, question.question_id, arm.name) in skip_workflow_ids

    every = [(q, r) for r in range(repeats) for q in questions]
    if isinstance(arm, ConductorArm):
        groups = [every[start:start + max_concurrent] for start in range(0, len(every), max_concurrent)]
        recorded_of = [{(q.question_id, r) for q, r in group if is_recorded(q, r)} for group in groups]
        left = [(group, recorded) for group, recorded in zip(groups, recorded_of, strict=True) if len(recorded) < len(group)]
        if isinstance(arm.policy, BatchingPolicy):
            return await _run_generated_groups(orchestrator, arm, left, run_id=run_id, max_concurrent=max_concurrent)
        records: list[WorkflowRecord] = []
        for group, recorded in left:
            records += await arm.answer_batch(
                orchestrator, group, run_id=run_id, max_concurrent=max_concurrent, recorded=recorded
            )
            await orchestrator.flush()
        return records
    pending = [(q, r) for q, r in every if not is_recorded(q, r)]
    gate = asyncio.Semaphore(max_concurrent)

    async def one(question: Question, repeat: int) -> WorkflowRecord:
        async with gate:
            return await arm.answer(orchestrator, question, run_id=run_id, repeat=repeat)

    results = await asyncio.gather(*(one(q, r) for q, r in pending))
    await orchestrator.flush()
    return list(results)


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

    # Tuples travel as JSON lists; `extra` holds only plain values, tuples and the routing W's predictions.
    ROUTING_PREDICTIONS: ClassVar[str] = "routing_predictions"

    def to_json_dict(self) -> dict[str, object]:
        """Plain JSON (how `eval_arms` hands the summary to `eval_tables`: never a pickle)."""
        extra = dict(self.extra)
        routing = extra.get(self.ROUTING_PREDICTIONS)
        if routing is not None:
            extra[self.ROUTING_PREDICTIONS] = routing.to_json_dict()
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}, "extra": extra}

    @classmethod
    def from_json_dict(cls, payload: Mapping[str, object]) -> EvalRunSummary:
        def restored(value: object) -> object:
            return tuple(restored(v) for v in value) if isinstance(value, list) else value

        extra = {key: restored(value) for key, value in dict(payload["extra"]).items()}
        if extra.get(cls.ROUTING_PREDICTIONS) is not None:
            extra[cls.ROUTING_PREDICTIONS] = RoutingPredictions.from_json_dict(payload["extra"][cls.ROUTING_PREDICTIONS])
        values = {f.name: restored(payload[f.name]) for f in fields(cls) if f.name != "extra" and f.name in payload}
        return cls(**values, extra=extra)
