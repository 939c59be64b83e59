"""Synthetic (prompt, completion) pairs of valid workflows: a supervised warm start for a tiny conductor.

A tiny policy sampled from scratch almost never writes a parseable workflow, so GRPO would see
reward 0 everywhere and get no gradient. A short SFT pass on these pairs teaches the *format* (and a
few plausible shapes: solve, solve-then-check, plan-then-solve, two solvers and a judge); routing is
left to RL, so workers are drawn uniformly and the pairs carry no claim about which worker is good.
Every target is rendered by `render_workflow`, so it parses by construction (and the tests check).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from conductor_pipeline.prompt import (
    CatalogueLike,
    Naming,
    PromptExample,
    as_catalogue,
    build_conductor_prompt,
    displayed_worker_names,
)
from conductor_pipeline.workflow import Step, Workflow, render_workflow

FINAL = "Give the final answer in \\boxed{}."


@dataclass(frozen=True)
class _Shape:
    """A workflow shape: subtasks with their access entries, how often it is drawn, and the
    one-line reasoning that precedes it ({0}, {1}, {2} are the displayed workers of its steps)."""

    subtasks: tuple[str, ...]
    sees: tuple[tuple[int, ...], ...]
    weight: float
    reasonings: tuple[str, ...]


# Weights lean to one step: the phase-0 finding is that most useful workflows are short, and a
# format warm start should not teach that every question needs three calls.
SHAPES: tuple[_Shape, ...] = (
    _Shape(
        (f"Solve the problem step by step. {FINAL}",),
        ((),),
        0.40,
        ("A single careful solver should be enough here; {0} takes it.", "This is direct: {0} solves it."),
    ),
    _Shape(
        (
            f"Solve the problem step by step. {FINAL}",
            f"Check the previous solution step by step. If you find an error, correct it. {FINAL}",
        ),
        ((), (0,)),
        0.25,
        ("{0} solves it and {1} checks the work.", "One solution from {0}, verified by {1}."),
    ),
    _Shape(
        (
            "Outline a plan for solving the problem: the quantities involved and the steps, without "
            "computing the final answer.",
            f"Follow the plan from the previous step to solve the problem. {FINAL}",
        ),
        ((), (0,)),
        0.10,
        ("A plan first helps here: {0} plans, {1} carries it out.",),
    ),
    _Shape(
        (
            f"Solve the problem. {FINAL}",
            f"Solve the problem independently, by a different method if you can. {FINAL}",
            f"Two solutions of the problem are given. Compare them, find any error, and give the correct "
            f"answer. {FINAL}",
        ),
        ((), (), (0, 1)),
        0.15,
        ("Two independent attempts from {0} and {1}, then {2} decides between them.",),
    ),
    _Shape(
        (
            f"Solve the problem step by step. {FINAL}",
            "Check the previous solution line by line and list any mistakes; do not solve it again.",
            f"Using the solution and the list of mistakes, write the corrected solution. {FINAL}",
        ),
        ((), (0,), (0, 1)),
        0.10,
        ("{0} solves, {1} looks for mistakes, {2} writes the corrected answer.",),
    ),
)


def _draw_workers(rng: random.Random, displayed: Sequence[str], n_steps: int) -> list[str]:
    """Distinct workers when the pool has enough of them (a checker should not be the solver)."""
    if len(displayed) >= n_steps:
        return rng.sample(list(displayed), n_steps)
    return [rng.choice(displayed) for _ in range(n_steps)]


def synthetic_workflows(
    questions: Sequence[str],
    workers: CatalogueLike,
    *,
    n: int,
    seed: int,
    naming: Naming = "ordinal",
    examples: Sequence[PromptExample] = (),
) -> list[tuple[list[dict[str, str]], str]]:
    """`n` (prompt messages, target completion) pairs over the pool's workers, deterministic in `seed`.

    `workers` are pool names or catalogue entries (with descriptions, as the prompt will show them).
    Targets use the paper's lists with ordinal indices under `naming="ordinal"`, names otherwise;
    parse a target with `parse_workflow(target, displayed_worker_names(workers, naming))`.
    """
    if not questions:
        raise ValueError("need at least one question")
    catalogue = as_catalogue(workers)
    if not catalogue:
        raise ValueError("need at least one worker")
    displayed = displayed_worker_names(catalogue, naming)
    rng = random.Random(seed)
    weights = [shape.weight for shape in SHAPES]
    pairs = []
    for _ in range(n):
        question = rng.choice(questions)
        shape = rng.choices(SHAPES, weights)[0]
        chosen = _draw_workers(rng, displayed, len(shape.subtasks))
        steps = zip(chosen, shape.subtasks, shape.sees, strict=True)
        workflow = Workflow(tuple(Step(worker, subtask, sees) for worker, subtask, sees in steps))
        reasoning = rng.choice(shape.reasonings).format(*chosen)
        lists = render_workflow(workflow, displayed, by_index=naming == "ordinal")
        messages = build_conductor_prompt(question, catalogue, naming=naming, examples=examples)
        pairs.append((messages, f"{reasoning}\n{lists}"))
    return pairs
