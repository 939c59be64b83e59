"""Agreement cascades: ask a few workers, answer when enough of them agree, otherwise ask the rest
of a vote and take its majority.

Disagreement among a few answers is a cheap signal that a question is hard, so a cascade spends the
vote's calls only where the vote can change the answer: the answer-consistency cascade of Yue et
al. (ICLR 2024, "Large Language Model Cascades with Mixture of Thought Representations for
Cost-efficient Reasoning"), here across workers instead of samples of one worker, as in adaptive
consistency (Aggarwal et al., EMNLP 2023). Agreement is the project's grader's (`vote.answer_groups`),
as in the vote arms.

Which workers are asked first, how many must agree and whom the vote adds are chosen on the train
split's probe answers (`choose_cascades`), replayed by the same rule the arm runs, and the chosen
cascades are measured on the eval slice like every other arm.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

import polars as pl

from conductor_pipeline.conductor.execution import StepOutcome, broadcast_workflow
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.evaluation.arms import VoteArm
from conductor_pipeline.evaluation.comparisons import DEFAULT_PAIRED, PairedSettings
from conductor_pipeline.evaluation.learning import compare_pairs, comparison_rows
from conductor_pipeline.evaluation.routers import BestSingleRouter
from conductor_pipeline.evaluation.vote import answer_groups, majority_index, majority_step
from conductor_pipeline.grading import is_equivalent
from conductor_pipeline.records import Question, WorkflowRecord
from conductor_pipeline.splits import train_split_rows

# The largest first stage tried: beyond three, a cascade costs about what the vote does.
MAX_FIRST_STAGE = 3


class CascadeChoiceError(ValueError):
    """The train split cannot choose a cascade (too few workers, or no question they all answered)."""


@dataclass(frozen=True)
class AgreementCascade:
    """Ask `first` (in this order); when `quorum` of their answers agree, the agreeing group answers.
    Otherwise ask `then` too and the majority of everyone asked answers (ties to the earliest asked)."""

    first: tuple[str, ...]
    then: tuple[str, ...]
    quorum: int

    def __post_init__(self) -> None:
        if not 2 <= self.quorum <= len(self.first):
            raise ValueError(f"a quorum of {self.quorum} out of {len(self.first)} first workers cannot be met")
        if not self.then:
            raise ValueError("a cascade adds at least one worker when the first ones disagree")
        if len(set(self.workers)) != len(self.workers):
            raise ValueError(f"a cascade asks each worker once, got {list(self.workers)}")

    @property
    def workers(self) -> tuple[str, ...]:
        """Everyone it may ask, in the order it asks them."""
        return (*self.first, *self.then)

    def describe(self) -> str:
        return f"{' + '.join(self.first)}; {self.quorum} agree, or add {' + '.join(self.then)} and vote"

    def agreed(self, answers: Sequence[str | None], equivalent: Callable[[str, str], bool] = is_equivalent) -> bool:
        """Whether the first stage's answers (all of it asked, none after) reach the quorum."""
        if len(answers) != len(self.first):
            return False
        return max((len(group) for group in answer_groups(answers, equivalent)), default=0) >= self.quorum

    def stop_after(self, outcomes: Sequence[StepOutcome]) -> bool:
        """The orchestrator's stopping rule (`Orchestrator.execute(stop_after=...)`)."""
        return self.agreed([o.graded.extracted if o.graded is not None else None for o in outcomes])


@dataclass(frozen=True)
class CascadeArm:
    """An agreement cascade as an eval arm: the vote's broadcast, stopped after the first stage when
    it agrees; the calls it made are the arm's cost."""

    label: str
    cascade: AgreementCascade
    PREFIX: ClassVar[str] = "cascade:"

    @property
    def name(self) -> str:
        return f"{self.PREFIX}{self.label}"

    async def answer(self, orchestrator: Orchestrator, question: Question, *, run_id: str, repeat: int) -> WorkflowRecord:
        broadcast = broadcast_workflow(self.cascade.workers, question)
        return await orchestrator.execute(
            question, broadcast, run_id=run_id, conductor_name=self.name, arm=self.name, repeat=repeat,
            final_step=majority_step, stop_after=self.cascade.stop_after,
        )


@dataclass(frozen=True)
class ReplayedOutcome:
    """What a cascade did on one question, from recorded answers."""

    correct: bool
    cost_usd: float
    calls: int


def replay_cascade(
    cascade: AgreementCascade,
    answers: Mapping[str, tuple[str | None, bool, float]],
    equivalent: Callable[[str, str], bool] = is_equivalent,
) -> ReplayedOutcome:
    """The cascade on one question whose workers' (extracted answer, correct, cost) are `answers`:
    the rule `CascadeArm` runs, on recordings."""
    first = [answers[w][0] for w in cascade.first]
    asked = cascade.first if cascade.agreed(first, equivalent) else cascade.workers
    answering = asked[majority_index([answers[w][0] for w in asked], equivalent)]
    return ReplayedOutcome(answers[answering][1], sum(answers[w][2] for w in asked), len(asked))


def agreement_table(
    questions: Sequence[Mapping[str, tuple[str | None, bool, float]]], workers: Sequence[str], threads: int = 2
) -> Callable[[str, str], bool]:
    """The grader's verdict on every ordered pair of the workers' answers to each question, computed
    once and in parallel (the math-verify residue runs on `threads` worker processes), as the
    `equivalent` of `answer_groups`: the candidates' replays then grade nothing new."""
    pairs = {
        (answers[later][0], answers[earlier][0])
        for answers in questions for later, earlier in itertools.permutations(workers, 2)
        if answers[later][0] is not None and answers[earlier][0] is not None
    }
    with ThreadPoolExecutor(max_workers=threads) as executor:
        verdicts = dict(zip(pairs, executor.map(lambda pair: is_equivalent(*pair), pairs)))
    return lambda answer, leader: verdicts[(answer, leader)]


def cascade_candidates(vote: Sequence[str], max_first: int = MAX_FIRST_STAGE) -> list[AgreementCascade]:
    """Every first stage of 2 to `max_first` of the vote's workers (in the vote's order), every
    quorum it can meet; the rest of the vote is added when it is not met."""
    candidates = []
    for size in range(2, min(max_first, len(vote) - 1) + 1):
        for first in itertools.combinations(vote, size):
            then = tuple(w for w in vote if w not in first)
            candidates += [AgreementCascade(first, then, quorum) for quorum in range(2, size + 1)]
    return candidates


@dataclass(frozen=True)
class CascadeChoice:
    """A cascade chosen on the train split for `goal`, with its train-split figures and the vote's."""

    label: str
    goal: str
    cascade: AgreementCascade
    vote: str  # the vote arm it is built from and compared with
    goal_met: bool  # False: no candidate met the goal on the train split, and this is the nearest
    accuracy: float
    cost_per_question: float
    escalated_share: float
    vote_accuracy: float
    vote_cost_per_question: float
    questions: int

    def arm(self) -> CascadeArm:
        return CascadeArm(self.label, self.cascade)

    def metadata(self) -> dict[str, object]:
        return {
            "arm": self.arm().name, "goal": self.goal, "goal_met": self.goal_met, "cascade": self.cascade.describe(),
            "vote": self.vote,
            "train_accuracy": round(self.accuracy, 4), "train_cost_per_question": self.cost_per_question,
            "train_escalated_share": round(self.escalated_share, 4), "train_vote_accuracy": round(self.vote_accuracy, 4),
            "train_vote_cost_per_question": self.vote_cost_per_question, "train_questions": self.questions,
        }


# label -> what the train split must show: the vote's accuracy at the least cost, or the most
# accuracy at half the vote's cost. Where no candidate meets its goal, the nearest is kept (the most
# accurate, the cheapest) and its `goal_met` says so.
CASCADE_GOALS: dict[str, str] = {
    "as-vote": "the cheapest cascade at least as accurate as the vote on the train split (else the most accurate)",
    "half-cost": "the most accurate cascade at no more than half the vote's cost on the train split (else the cheapest)",
}


def answers_by_question(
    probe_answers: pl.DataFrame, workers: Sequence[str]
) -> dict[str, dict[str, tuple[str | None, bool, float]]]:
    """question_id -> worker -> (extracted answer, correct, cost) from `sql/probe_answers.sql` rows,
    for the questions every one of `workers` answered (a replay's inputs)."""
    by_question: dict[str, dict[str, tuple[str | None, bool, float]]] = {}
    for row in probe_answers.filter(pl.col("worker").is_in(list(workers))).iter_rows(named=True):
        by_question.setdefault(row["question_id"], {})[row["worker"]] = (
            row["extracted_answer"], bool(row["correct"]), float(row["cost_usd"] or 0.0)
        )
    return {question: answers for question, answers in by_question.items() if len(answers) == len(workers)}


def choose_cascades(probe_answers: pl.DataFrame, vote_arm: VoteArm) -> list[CascadeChoice]:
    """One cascade per `CASCADE_GOALS` entry, over the vote's workers (best first), chosen on the
    train-split questions every one of them answered.

    `probe_answers`: question_id, worker, extracted_answer, correct, cost_usd (`sql/probe_answers.sql`);
    eval-split rows are dropped first."""
    vote = vote_arm.workers
    if len(vote) < 3:
        raise CascadeChoiceError(f"a cascade needs a vote of at least three workers, got {list(vote)}")
    questions = list(answers_by_question(train_split_rows(probe_answers, vote), vote).values())
    if not questions:
        raise CascadeChoiceError(f"no train-split question has probe answers from every worker of {list(vote)}")
    equivalent = agreement_table(questions, vote)
    n = len(questions)

    def totals(outcomes: list[ReplayedOutcome], first_calls: int) -> tuple[float, float, float]:
        return (sum(o.correct for o in outcomes) / n, sum(o.cost_usd for o in outcomes) / n,
                sum(o.calls > first_calls for o in outcomes) / n)

    def vote_correct(answers: Mapping[str, tuple[str | None, bool, float]]) -> bool:
        return answers[vote[majority_index([answers[w][0] for w in vote], equivalent)]][1]

    vote_accuracy = sum(vote_correct(a) for a in questions) / n
    vote_cost = sum(sum(a[w][2] for w in vote) for a in questions) / n
    scored = [
        (candidate, *totals([replay_cascade(candidate, a, equivalent) for a in questions], len(candidate.first)))
        for candidate in cascade_candidates(vote)
    ]
    as_vote = [s for s in scored if s[1] >= vote_accuracy]
    half = [s for s in scored if s[2] <= vote_cost / 2]
    picks = {
        "as-vote": (min(as_vote, key=lambda s: (s[2], -s[1])) if as_vote else max(scored, key=lambda s: s[1]), bool(as_vote)),
        "half-cost": (max(half, key=lambda s: (s[1], -s[2])) if half else min(scored, key=lambda s: s[2]), bool(half)),
    }
    return [
        CascadeChoice(label, CASCADE_GOALS[label], cascade, vote_arm.name, met, accuracy, cost, escalated,
                      vote_accuracy, vote_cost, n)
        for label, ((cascade, accuracy, cost, escalated), met) in picks.items()
    ]


def cascade_stops(workflows: pl.DataFrame, first_stage: Mapping[str, int]) -> pl.DataFrame:
    """Per cascade arm (arm -> how many workers it asks first): the share of scored workflows that
    escalated to the vote, and how often it stopped after the first stage right and wrong."""
    scored = workflows.filter(pl.col("arm").is_in(list(first_stage)) & pl.col("correct").is_not_null())
    if scored.height == 0:
        return pl.DataFrame(schema={"arm": pl.String, "workflows": pl.Int64, "escalated_share": pl.Float64,
                                    "stopped_right": pl.Int64, "stopped_wrong": pl.Int64})
    stopped = pl.col("n_steps") <= pl.col("arm").replace_strict(dict(first_stage), return_dtype=pl.Int64)
    return (
        scored.group_by("arm", maintain_order=True)
        .agg(
            pl.len().alias("workflows"),
            (~stopped).mean().alias("escalated_share"),
            (stopped & pl.col("correct")).sum().alias("stopped_right"),
            (stopped & ~pl.col("correct")).sum().alias("stopped_wrong"),
        )
        .with_columns(pl.col("workflows").cast(pl.Int64), pl.col("stopped_right").cast(pl.Int64),
                      pl.col("stopped_wrong").cast(pl.Int64))
    )


def cascade_comparisons(
    workflows: pl.DataFrame, cascades: Mapping[str, str], *, settings: PairedSettings = DEFAULT_PAIRED
) -> pl.DataFrame:
    """Each cascade arm (arm -> the vote it is built from) paired against that vote (does stopping
    early lose accuracy?) and the best single worker, Holm-adjusted over the table."""
    why = {}
    for arm, vote in cascades.items():
        why[(arm, vote)] = "the vote it stops early"
        why[(arm, BestSingleRouter.name)] = "best single worker"
    return comparison_rows(compare_pairs(workflows, list(why), settings=settings), why)
