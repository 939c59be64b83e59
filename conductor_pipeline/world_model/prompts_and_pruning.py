"""Where the pipeline uses W: in-context predictions, and pruning GRPO questions with an audit."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.records import Question, stable_id
from conductor_pipeline.world_model.features import WorldModelSettings
from conductor_pipeline.world_model.model import WorldModel, fit_on_train_split

# Pruning: skip a question when W predicts every shown worker above HIGH (all solve) or below LOW.
PRUNE_LOW, PRUNE_HIGH = 0.05, 0.95


def prompt_predictor(
    model: WorldModel, seats: Sequence[WorkerSeat] | Mapping[str, WorkerSeat]
) -> Callable[[Question], dict[str, float]]:
    """question -> {seat name: P(success)} for the conductor prompt's catalogue.

    Seats that cannot answer alone get no number: the conductor itself (recursion; W knows
    workers, not the policy) and a vote (its success depends on the steps it is shown, which the
    prompt cannot know yet).
    """
    workers = _solo_seats(seats)

    def predict(question: Question) -> dict[str, float]:
        return predicted_success_for_prompt(model, question, workers)

    return predict


def _solo_seats(seats: Sequence[WorkerSeat] | Mapping[str, WorkerSeat]) -> list[WorkerSeat]:
    """The seats that answer a question alone (`WorkerSeat.answers_alone`), in order."""
    seat_list = list(seats.values()) if isinstance(seats, Mapping) else list(seats)
    return [seat for seat in seat_list if seat.answers_alone]


def predicted_success_for_prompt(
    model: WorldModel, question: Question | str, seats: Sequence[WorkerSeat] | Mapping[str, WorkerSeat]
) -> dict[str, float]:
    """worker name -> W's P(success) on the question, for the conductor prompt's catalogue lines."""
    seat_list = list(seats.values()) if isinstance(seats, Mapping) else list(seats)
    predicted = model.predict_success([question], seat_list)[0]
    return {seat.name: round(float(p), 3) for seat, p in zip(seat_list, predicted)}


# Folds of the out-of-fold predictions shown in training prompts.
PROMPT_FOLDS = 5


def out_of_fold_prompt_success(
    frame: pl.DataFrame,
    questions: Sequence[Question],
    seats: Sequence[WorkerSeat] | Mapping[str, WorkerSeat],
    *,
    folds: int = PROMPT_FOLDS,
    settings: WorldModelSettings | None = None,
) -> dict[str, dict[str, float]]:
    """question id -> {seat: W's P(success)} for training prompts, each from a train-split W that
    never saw that question: the questions are cut into `folds` (by a hash of their id) and each
    fold's numbers come from W fitted on the other folds' rows and every other train-split question.

    Why not one train-split W for all: its numbers on its own training questions are memory of their
    outcomes, so a policy trained on them learns to trust W far more than W deserves on new
    questions (where the eval shows it numbers from the same train-split W, out of sample).
    """
    workers = {seat.name: seat for seat in _solo_seats(seats)}
    fold_of = {q.question_id: int(stable_id("prompt-fold", q.question_id)[:8], 16) % folds for q in questions}
    shown: dict[str, dict[str, float]] = {}
    for fold in range(folds):
        held_out = [q for q in questions if fold_of[q.question_id] == fold]
        if not held_out:
            continue
        model = fit_on_train_split(
            frame.filter(~pl.col("question_id").is_in([q.question_id for q in held_out])), workers, settings
        )
        shown.update((q.question_id, predicted_success_for_prompt(model, q, workers)) for q in held_out)
    return shown


def prune_zero_variance(
    model: WorldModel,
    questions: Sequence[Question],
    seats: Sequence[WorkerSeat] | Mapping[str, WorkerSeat],
    *,
    low: float = PRUNE_LOW,
    high: float = PRUNE_HIGH,
) -> tuple[list[Question], list[Question]]:
    """Split GRPO questions into (kept, skipped): skipped ones W predicts every worker solves
    (all P > high) or none solves (all P < low), so their rollout groups would likely carry zero
    reward variance and no gradient. Audit the skip with `audit_pruning` once rewards are known.
    Only seats that answer alone are weighed: a vote, asked alone, has P ~ 0, which would keep
    every question W expects all workers to solve.
    """
    if not 0 <= low < high <= 1:
        raise ValueError(f"need 0 <= low < high <= 1, got low={low}, high={high}")
    if not questions:
        return [], []
    seat_list = _solo_seats(seats)
    if not seat_list:
        raise ValueError(
            "pruning needs at least one seat that answers alone; every seat given is a conductor or a vote"
        )
    predicted = model.predict_success(list(questions), seat_list)
    all_solve = (predicted > high).all(axis=1)
    none_solve = (predicted < low).all(axis=1)
    skip = all_solve | none_solve
    kept = [q for q, s in zip(questions, skip) if not s]
    skipped = [q for q, s in zip(questions, skip) if s]
    return kept, skipped


@dataclass(frozen=True)
class PruningAudit:
    """How many skipped questions really had zero reward variance when their rollouts were observed."""

    skipped: int
    observed: int
    really_zero_variance: int

    @property
    def precision(self) -> float | None:
        return self.really_zero_variance / self.observed if self.observed else None

    def describe(self) -> str:
        share = f"{self.precision:.0%}" if self.precision is not None else "n/a"
        return (
            f"skipped {self.skipped} questions; rewards observed for {self.observed}; "
            f"{self.really_zero_variance} of those really had zero reward variance ({share})"
        )


def audit_pruning(
    skipped: Sequence[Question | str], observed_rewards: Mapping[str, Sequence[float]], *, tolerance: float = 1e-9
) -> PruningAudit:
    """Check the pruning decision against observed rollout rewards (question_id -> group rewards)."""
    ids = [q.question_id if isinstance(q, Question) else q for q in skipped]
    observed = [observed_rewards[qid] for qid in ids if qid in observed_rewards and len(observed_rewards[qid]) > 0]
    zero = sum(1 for rewards in observed if float(np.ptp(np.asarray(rewards, dtype=float))) <= tolerance)
    return PruningAudit(skipped=len(ids), observed=len(observed), really_zero_variance=zero)
