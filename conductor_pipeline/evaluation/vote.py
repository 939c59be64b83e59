"""Majority vote over workers' extracted answers: the broadcast-and-aggregate baseline's answer.

Answers are grouped by the project's grader (`is_equivalent`), not by string equality: `\\frac12`
and `0.5` are one vote. A worker whose response has no extractable answer abstains. Voters come in
rank order (best first on the train split): among equally large groups the one whose best voter
ranks highest wins, and a group's best-ranked voter answers for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from conductor_pipeline.conductor.execution import StepOutcome
from conductor_pipeline.grading import is_equivalent


def answer_groups(
    answers: Sequence[str | None], equivalent: Callable[[str, str], bool] = is_equivalent
) -> list[list[int]]:
    """The voters' indices grouped by equivalent answer (answers in rank order, best first).

    Each answer joins the first earlier group whose first answer it is equivalent to; abstentions
    (None) join none. Groups come in the order of their first voter."""
    groups: list[list[int]] = []
    for index, answer in enumerate(answers):
        if answer is None:
            continue
        for group in groups:
            if equivalent(answer, answers[group[0]]):
                group.append(index)
                break
        else:
            groups.append([index])
    return groups


def majority_index(
    answers: Sequence[str | None], equivalent: Callable[[str, str], bool] = is_equivalent
) -> int:
    """Index of the voter whose answer the majority gives (answers in rank order, best first).

    The largest group of `answer_groups` wins, ties to the group whose first voter ranks highest;
    its first voter is returned. When every voter abstains (None), the best-ranked voter (index 0)
    answers.
    """
    if not answers:
        raise ValueError("a vote needs at least one voter")
    groups = answer_groups(answers, equivalent)
    if not groups:
        return 0
    # Groups are created in rank order, so the first of the largest holds the best-ranked voter.
    return max(groups, key=len)[0]


def majority_step(outcomes: Sequence[StepOutcome]) -> int:
    """The step whose answer the majority of the steps' graded answers gives (the orchestrator's
    `final_step` for a broadcast workflow whose steps are in rank order)."""
    return majority_index([o.graded.extracted if o.graded is not None else None for o in outcomes])
