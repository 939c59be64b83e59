"""Routers: best single worker, a random worker, the oracle, the world-model (W) router and cascade.

Each picks one worker per question and yields a one-step workflow (the question as the
subtask), so routers flow through the orchestrator and the same warehouse tables as every
conductor. Why these: the best single worker is the bar a conductor must clear to be worth
anything; the random router shows what routing without information gives; the oracle (correct
when any worker solves the question solo) is the ceiling no router can pass; the W-router shows
what the world model's per-question predictions are worth as routing, with no conductor at all;
the W-cascade spends them on cost: the cheapest worker W trusts enough answers.
Each router class names its arm (`name`), so the eval run and its tables find it by that name.

The best single worker is chosen on the calibration (train) split only: choosing it on the
eval slice would hand the baseline the test answers and understate any conductor's gap. For the
same reason the W-router's model must be fitted on train-split questions only
(`conductor_pipeline.world_model.fit_on_train_split`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np
import polars as pl

from conductor_pipeline.conductor.execution import one_step_workflow
from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.records import Question, stable_id
from conductor_pipeline.splits import split_of, train_split_rows
from conductor_pipeline.workflow import Workflow


class CalibrationError(ValueError):
    """The calibration data cannot choose a best single worker (no train-split outcomes)."""


@dataclass(frozen=True)
class BestSingleChoice:
    """The chosen worker, every worker's calibration accuracy, and the questions it was chosen on."""

    worker: str
    accuracies: dict[str, float]
    calibration_question_ids: frozenset[str]


def choose_best_single(
    probe_outcomes: pl.DataFrame, workers: Sequence[str], *, split_fn=split_of
) -> BestSingleChoice:
    """The worker with the highest mean pass rate on train-split questions every worker answered.

    `probe_outcomes` has one row per question x worker with `question_id`, `worker` and either
    `pass_rate` or `successes` and `samples`. Eval-split rows are dropped before anything is
    computed. Ties go to the smallest name, as in the oracle-ceiling SQL.
    """
    if "pass_rate" not in probe_outcomes.columns:
        probe_outcomes = probe_outcomes.with_columns(
            (pl.col("successes") / pl.col("samples")).alias("pass_rate")
        )
    frame = train_split_rows(probe_outcomes, workers, split_fn=split_fn).filter(pl.col("pass_rate").is_not_null())
    covered = frame.group_by("question_id").agg(pl.col("worker").n_unique().alias("n"))
    common = covered.filter(pl.col("n") == len(set(workers)))["question_id"].to_list()
    if not common:
        raise CalibrationError(
            f"no train-split question has probe outcomes for every worker of {sorted(workers)}"
        )
    per_worker = (
        frame.filter(pl.col("question_id").is_in(common))
        .group_by("worker")
        .agg(pl.col("pass_rate").mean().alias("accuracy"))
        .sort(["accuracy", "worker"], descending=[True, False])
    )
    accuracies = dict(zip(per_worker["worker"].to_list(), per_worker["accuracy"].to_list(), strict=True))
    return BestSingleChoice(
        worker=per_worker["worker"][0], accuracies=accuracies, calibration_question_ids=frozenset(common)
    )


@dataclass(frozen=True)
class BestSingleRouter:
    """Always the worker chosen on the calibration split."""

    choice: BestSingleChoice
    name: ClassVar[str] = "best_single"

    def route(self, question: Question, repeat: int = 0) -> Workflow:
        return one_step_workflow(self.choice.worker, question)


@dataclass(frozen=True)
class RandomRouter:
    """A uniformly random worker, drawn from (seed, question, repeat) so reruns pick the same."""

    workers: tuple[str, ...]
    seed: int = 0
    name: ClassVar[str] = "random"

    def route(self, question: Question, repeat: int = 0) -> Workflow:
        rng = random.Random(stable_id("random-router", self.seed, question.question_id, repeat))
        return one_step_workflow(rng.choice(self.workers), question)


@dataclass(frozen=True)
class OracleRouter:
    """The upper bound: a worker that solved the question solo, if any did.

    `solo_correct` maps question id -> {worker: solved solo}; it comes from the solo arms on
    the same questions (hindsight is the point of an oracle). When nobody solved a question the
    fallback worker answers and is wrong, as any router would be.
    """

    solo_correct: Mapping[str, Mapping[str, bool]]
    fallback: str
    name: ClassVar[str] = "oracle"

    def route(self, question: Question, repeat: int = 0) -> Workflow:
        verdicts = self.solo_correct.get(question.question_id, {})
        solvers = sorted(worker for worker, solved in verdicts.items() if solved)
        # Prefer the fallback (the best single worker) when it solves the question, for stability.
        chosen = self.fallback if self.fallback in solvers or not solvers else solvers[0]
        return one_step_workflow(chosen, question)


def solo_verdicts(rows: Iterable[Mapping[str, object]]) -> dict[str, dict[str, bool]]:
    """{question: {worker: majority verdict}} from (question_id, worker, correct) rows of solo arms.

    Majority as in the `outcomes` view: strictly more than half the scored repeats correct.
    """
    tallies: dict[tuple[str, str], list[bool]] = {}
    for row in rows:
        if row["correct"] is None:
            continue
        tallies.setdefault((str(row["question_id"]), str(row["worker"])), []).append(bool(row["correct"]))
    verdicts: dict[str, dict[str, bool]] = {}
    for (question_id, worker), marks in tallies.items():
        verdicts.setdefault(question_id, {})[worker] = 2 * sum(marks) > len(marks)
    return verdicts


class SuccessAndCostModel(Protocol):
    """What the W-router needs of a world model (conductor_pipeline.world_model.WorldModel)."""

    training_question_ids: frozenset[str]

    def predict_success(self, subtasks: Sequence[Question], workers: Sequence[WorkerSeat]) -> np.ndarray: ...

    def predict_cost(self, subtasks: Sequence[Question], workers: Sequence[WorkerSeat]) -> np.ndarray: ...


@dataclass(frozen=True)
class WorldModelRouter:
    """Per question, the worker with the highest W score: P(success) - lambda_cost x expected cost.

    `lambda_cost` is in accuracy per USD (a call costs ~1e-3 USD, so it matters from ~10 up);
    0 (the default) routes on predicted success alone. A worker without a cost prediction (no cost
    regressor: NaN) is charged nothing rather than being excluded. Ties go to the earlier seat.
    """

    model: SuccessAndCostModel = field(repr=False)
    seats: tuple[WorkerSeat, ...]
    lambda_cost: float = 0.0
    name: ClassVar[str] = "w_router"

    def __post_init__(self) -> None:
        if not self.seats:
            raise ValueError("the W-router needs at least one seat")
        if self.lambda_cost < 0:
            raise ValueError(f"lambda_cost must be >= 0, got {self.lambda_cost}")

    def scores(self, questions: Sequence[Question]) -> np.ndarray:
        """The routing score, shape (len(questions), len(seats)), in one batch."""
        success = np.asarray(self.model.predict_success(list(questions), list(self.seats)), dtype=float)
        if self.lambda_cost <= 0:
            return success
        cost = np.asarray(self.model.predict_cost(list(questions), list(self.seats)), dtype=float)
        return w_router_scores(success, cost, self.lambda_cost)

    def choose(self, questions: Sequence[Question]) -> list[str]:
        """The chosen seat name per question."""
        if not questions:
            return []
        return [self.seats[i].name for i in self.scores(questions).argmax(axis=1)]

    def route(self, question: Question, repeat: int = 0) -> Workflow:
        (chosen,) = self.choose([question])
        return one_step_workflow(chosen, question)


def w_router_scores(success: np.ndarray, cost: np.ndarray, lambda_cost: float) -> np.ndarray:
    """P(success) - lambda x predicted cost per (question, seat); an unknown cost (NaN) is charged 0."""
    return np.asarray(success, dtype=float) - lambda_cost * np.nan_to_num(np.asarray(cost, dtype=float))


def list_price_per_mtok(seat: WorkerSeat) -> float:
    """Input plus output list price (USD per million tokens): the order of the cascade's ladder."""
    return seat.price_input_per_mtok + seat.price_output_per_mtok


def cascade_choice(success: np.ndarray, ladder: Sequence[int], fallback: int, threshold: float) -> np.ndarray:
    """Per question (row of `success`), the first seat of `ladder` (seat indices, cheapest first)
    whose predicted success reaches `threshold`; `fallback` where none does."""
    rungs = np.asarray(success, dtype=float)[:, list(ladder)] >= threshold
    first = rungs.argmax(axis=1)
    return np.where(rungs.any(axis=1), np.asarray(ladder)[first], fallback)


@dataclass(frozen=True)
class WCascadeRouter:
    """The cheapest worker W trusts: climb the seats from the lowest list price and stop at the
    first whose predicted success (a train-split W) reaches `threshold`; when none does, the best
    single worker (chosen on the train split) answers.

    W predicts before any call, so a rung it rates below the threshold is passed over without a
    call: the cost is the one call made. The threshold is in the arm's name, which keys the run.
    """

    model: SuccessAndCostModel = field(repr=False)
    seats: tuple[WorkerSeat, ...]
    fallback: str
    threshold: float = 0.5
    family: ClassVar[str] = "w_cascade"

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"the cascade threshold is a probability, got {self.threshold}")
        if self.fallback not in {seat.name for seat in self.seats}:
            raise ValueError(f"cascade fallback {self.fallback!r} is not one of the seats")

    @property
    def name(self) -> str:
        return f"{self.family}@{self.threshold:g}"

    @property
    def ladder(self) -> list[int]:
        """Seat indices from the cheapest list price up (ties: seat order)."""
        return sorted(range(len(self.seats)), key=lambda i: (list_price_per_mtok(self.seats[i]), i))

    def choose(self, questions: Sequence[Question]) -> list[str]:
        if not questions:
            return []
        success = np.asarray(self.model.predict_success(list(questions), list(self.seats)), dtype=float)
        fallback = next(i for i, seat in enumerate(self.seats) if seat.name == self.fallback)
        return [self.seats[i].name for i in cascade_choice(success, self.ladder, fallback, self.threshold)]

    def route(self, question: Question, repeat: int = 0) -> Workflow:
        (chosen,) = self.choose([question])
        return one_step_workflow(chosen, question)
