"""Synthetic (prompt, completion) pairs of valid workflows: a supervised warm start for a tiny conductor.

A tiny policy sampled from scratch almost never writes a parseable workflow, so GRPO would see
reward 0 everywhere and get no gradient. A short SFT pass on these pairs teaches the *format* (and a
few plausible shapes: solve, solve-then-check, plan-then-solve, two solvers and a judge); routing is
left to RL, so workers are drawn uniformly and the pairs carry no claim about which worker is good.
Every target is rendered by `render_workflow`, so it parses by construction (and the tests check).

A prompt that shows an aggregator seat (`backend: vote`) and at least `MIN_VOTE_INPUTS` (three)
workers that answer alone also gets fan-out-and-aggregate targets (`FAN_OUT_SHARE` of them): three
or more workers solve the problem independently, then the vote sees all of them (a vote over two
only repeats the first). An aggregator is never drawn for any other
step (with nothing to aggregate it answers nothing), so no target is a vote alone. With
`fan_out_only`, every multi-step target on such a prompt is a fan-out instead (single steps keep
their share): whether to call more than one worker is then the same choice as whether to vote.

Two styles:
- "paper": a one-line reasoning that names the workers, then the three lists; five shapes of one to
  three steps with varied subtask wording. What a 1.5B-7B instruct model can imitate.
- "compact" (the CPU profile): the three lists only, from a small fixed set of subtask phrasings
  (`COMPACT_SUBTASKS`), one to three steps. Why: a 2-4 layer model sampled at temperature 1 must
  reproduce every structural token of ~25-60 tokens; each free choice in the target (reasoning
  wording, phrasing) is entropy the model cannot tell apart from the format and samples as noise.
  "Paper" targets leave the tiny model almost never parseable at temperature 1; compact ones teach
  it the format. The remaining free choices are exactly the ones GRPO should learn: which worker,
  how many steps.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from conductor_pipeline.conductor.prompt import (
    CatalogueLike,
    Naming,
    PromptExample,
    as_catalogue,
    build_conductor_prompt,
    displayed_worker_names,
)
from conductor_pipeline.pools.backends.vote import MIN_VOTE_INPUTS
from conductor_pipeline.workflow import DEFAULT_MAX_STEPS, Step, Workflow, render_workflow

FINAL = "Give the final answer in \\boxed{}."
SyntheticStyle = Literal["paper", "compact", "named"]


@dataclass(frozen=True)
class _Shape:
    """A workflow shape: subtasks with their access entries, how often it is drawn, and the
    one-line reasoning that precedes it ({0}, {1}, {2} are the displayed workers of its steps)."""

    subtasks: tuple[str, ...]
    sees: tuple[tuple[int, ...], ...]
    weight: float
    reasonings: tuple[str, ...]


# Weights lean to one step: most useful workflows are short (a prompted conductor's parsed workflows
# were nearly all single-step), and a format warm start should not teach that every question needs
# three calls.
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


# The compact style's only phrasings: short, plain words the tiny tokenizer is trained on
# (`conductor_pipeline.tiny_models.default_tokenizer_corpus` includes rendered compact targets).
COMPACT_SUBTASKS: tuple[str, ...] = (
    f"Solve the problem. {FINAL}",
    f"Check the previous solution. {FINAL}",
    f"Solve the problem another way. {FINAL}",
    f"Compare the solutions. {FINAL}",
)
_SOLVE, _CHECK, _SOLVE_AGAIN, _COMPARE = COMPACT_SUBTASKS
# One step most often (most useful workflows are short), then solve-and-check, then two solvers
# and a judge: up to three steps, which fits the CPU profile's completion cap in tiny tokens.
COMPACT_SHAPES: tuple[_Shape, ...] = (
    _Shape((_SOLVE,), ((),), 0.55, ("",)),
    _Shape((_SOLVE, _CHECK), ((), (0,)), 0.30, ("",)),
    _Shape((_SOLVE, _SOLVE_AGAIN, _COMPARE), ((), (), (0, 1)), 0.15, ("",)),
)
STYLES: dict[str, tuple[_Shape, ...]] = {"paper": SHAPES, "compact": COMPACT_SHAPES, "named": COMPACT_SHAPES}

# Fan-out-and-aggregate targets, on prompts that show an aggregator and two or more workers that
# answer alone: this share of them, so the shape is common enough to be sampled at temperature 1
# but single-worker shapes stay the majority. At most this many solvers before the vote: in the
# compact style three solvers and the vote fit the CPU profile's 80-token completion cap (a test
# checks); the paper style allows four (the five-step limit).
FAN_OUT_SHARE = 0.3
MAX_FAN_OUT: dict[str, int] = {"compact": 3, "named": 3, "paper": 4}
FAN_OUT_SUBTASKS: dict[str, tuple[str, str]] = {  # (each solver's subtask, the aggregator's)
    "compact": (_SOLVE, _COMPARE),
    "named": (_SOLVE, _COMPARE),
    "paper": (
        f"Solve the problem independently, step by step. {FINAL}",
        f"Give the final answer most of the solutions agree on. {FINAL}",
    ),
}


def _draw_workers(rng: random.Random, displayed: Sequence[str], n_steps: int) -> list[str]:
    """Distinct workers when the pool has enough of them (a checker should not be the solver)."""
    if len(displayed) >= n_steps:
        return rng.sample(list(displayed), n_steps)
    return [rng.choice(displayed) for _ in range(n_steps)]


def synthetic_target(
    rng: random.Random,
    displayed: Sequence[str],
    *,
    naming: Naming,
    style: SyntheticStyle,
    aggregators: Collection[str] = (),
    labels: Mapping[str, str] | None = None,
    fan_out_only: bool = False,
    max_fan_out: int | None = None,
) -> str:
    """One valid workflow text over the `displayed` worker names, drawn from the style's shapes;
    `aggregators` are the displayed names of vote seats, drawn only to aggregate a fan-out. The
    "named" style first names each chosen worker by its catalogue label (`labels`: displayed name ->
    `worker_label` of its description) and then by its displayed name, one line each. With
    `fan_out_only` and an aggregator shown, a drawn multi-step shape becomes a fan-out; a fan-out
    has `MIN_VOTE_INPUTS` to `max_fan_out` solvers (default: the style's `MAX_FAN_OUT`)."""
    solvers = [name for name in displayed if name not in aggregators]
    if not solvers:
        raise ValueError(f"no displayed worker answers alone: {list(displayed)} are all aggregators")
    shown_aggregators = [name for name in displayed if name in aggregators]
    can_fan_out = bool(shown_aggregators) and len(solvers) >= MIN_VOTE_INPUTS
    shapes = STYLES[style]
    if can_fan_out and fan_out_only:
        shape = rng.choices(shapes, [s.weight for s in shapes])[0]
        fan_out = len(shape.subtasks) > 1
    else:
        shape, fan_out = None, can_fan_out and rng.random() < FAN_OUT_SHARE
    if fan_out:
        workflow, reasoning = _fan_out(rng, solvers, rng.choice(shown_aggregators), style, max_fan_out)
    else:
        shape = shape or rng.choices(shapes, [s.weight for s in shapes])[0]
        chosen = _draw_workers(rng, solvers, len(shape.subtasks))
        steps = zip(chosen, shape.subtasks, shape.sees, strict=True)
        workflow = Workflow(tuple(Step(worker, subtask, sees) for worker, subtask, sees in steps))
        reasoning = rng.choice(shape.reasonings).format(*chosen)
    lists = render_workflow(workflow, displayed, by_index=naming == "ordinal")
    if style == "named":
        if labels is None:
            raise ValueError("the named style needs each displayed worker's catalogue label")
        reasoning = "\n".join(f"{labels[w]} = {w}" for w in dict.fromkeys(step.worker for step in workflow.steps))
    return f"{reasoning}\n{lists}" if reasoning else lists


def _fan_out(
    rng: random.Random, solvers: Sequence[str], aggregator: str, style: SyntheticStyle, max_fan_out: int | None
) -> tuple[Workflow, str]:
    """`MIN_VOTE_INPUTS` or more distinct solvers answer independently, then the aggregator sees all of them."""
    widest = MAX_FAN_OUT[style] if max_fan_out is None else max_fan_out
    if not MIN_VOTE_INPUTS <= widest < DEFAULT_MAX_STEPS:
        raise ValueError(f"max_fan_out must be {MIN_VOTE_INPUTS} to {DEFAULT_MAX_STEPS - 1} (a vote needs "
                         f"{MIN_VOTE_INPUTS} answers; a workflow has at most {DEFAULT_MAX_STEPS} steps, the vote one "
                         f"of them), got {widest}")
    chosen = rng.sample(list(solvers), rng.randint(MIN_VOTE_INPUTS, min(len(solvers), widest)))
    solve, aggregate = FAN_OUT_SUBTASKS[style]
    steps = [Step(worker, solve, ()) for worker in chosen]
    steps.append(Step(aggregator, aggregate, tuple(range(len(chosen)))))
    reasoning = "" if style == "compact" else (
        f"{', '.join(chosen[:-1])} and {chosen[-1]} solve it independently; {aggregator} takes the answer most of them give."
    )
    return Workflow(tuple(steps)), reasoning


def synthetic_workflows(
    questions: Sequence[str],
    workers: CatalogueLike,
    *,
    n: int,
    seed: int,
    naming: Naming = "ordinal",
    examples: Sequence[PromptExample] = (),
    style: SyntheticStyle = "paper",
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
    pairs = []
    for _ in range(n):
        question = rng.choice(questions)
        target = synthetic_target(rng, displayed, naming=naming, style=style)
        pairs.append((build_conductor_prompt(question, catalogue, naming=naming, examples=examples), target))
    return pairs


def warm_start_pairs(
    rows: Sequence[dict[str, Any]],
    *,
    n: int,
    seed: int,
    naming: Naming = "ordinal",
    style: SyntheticStyle = "paper",
    aggregators: Collection[str] = (),
    labels: Mapping[str, str] | None = None,
    fan_out_only: bool = False,
    max_fan_out: int | None = None,
) -> list[tuple[list[dict[str, str]], str]]:
    """`n` pairs on exactly the GRPO prompts: each row's `prompt` messages with a target over the
    workers that prompt showed (`row["workers"]`), cycling through the rows in a seeded order.
    `aggregators` are the pool's vote seats (real names): prompts that show one get fan-out targets
    (with `fan_out_only`, as their only multi-step targets; of up to `max_fan_out` solvers: `synthetic_target`).
    `labels` (real name -> catalogue label) are what the "named" style calls each worker.

    Why the GRPO rows themselves: the warm start then sees the same catalogue text, sub-pool sizes,
    naming and examples the policy is sampled on, so the format it learns is the one GRPO scores.
    """
    if not rows:
        raise ValueError("need at least one prompt row")
    rng = random.Random(seed)
    order = list(range(len(rows)))
    pairs = []
    while len(pairs) < n:
        rng.shuffle(order)
        for index in order[: n - len(pairs)]:
            row = rows[index]
            displayed = displayed_worker_names(row["workers"], naming)
            shown_aggregators = [name for name, real in zip(displayed, row["workers"], strict=True) if real in aggregators]
            shown_labels = (
                {name: labels[real] for name, real in zip(displayed, row["workers"], strict=True)} if labels else None
            )
            target = synthetic_target(
                rng, displayed, naming=naming, style=style, aggregators=shown_aggregators, labels=shown_labels,
                fan_out_only=fan_out_only, max_fan_out=max_fan_out,
            )
            pairs.append((list(row["prompt"]), target))
    return pairs


def format_corpus(count: int, seed: int, max_workers: int = 8) -> list[str]:
    """Rendered targets of every style over ordinal pools of 2..max_workers: tokenizer training text,
    so the words and punctuation a conductor writes get merges of their own."""
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        displayed = displayed_worker_names(["w"] * rng.randint(2, max_workers), "ordinal")
        texts.append(synthetic_target(rng, displayed, naming="ordinal", style="compact" if index % 2 else "paper"))
    return texts
