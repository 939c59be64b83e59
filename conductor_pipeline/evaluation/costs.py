"""What accuracy costs: the arms' accuracy-vs-cost frontier, and the W-router's and the W-cascade's
cost knobs swept over the recorded solo answers.

A W-router or W-cascade configuration sends each question to one worker with the question itself
as the subtask: exactly the solo arm's call for that worker. So every configuration's accuracy and
cost on the eval questions follow from the solo arms' recorded verdicts and costs and the routing
W's predictions, with no new call; each gets the paired test against the best single worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from conductor_pipeline.evaluation.arms import SoloArm
from conductor_pipeline.evaluation.comparisons import (
    DEFAULT_PAIRED,
    REFERENCE_ARM,
    PairedSettings,
    aligned_scores,
    question_scores,
)
from conductor_pipeline.evaluation.routers import (
    OracleRouter,
    WCascadeRouter,
    WorldModelRouter,
    cascade_choice,
    w_router_scores,
)
from conductor_pipeline.evaluation.routing_predictions import RoutingPredictions
from conductor_pipeline.stats import compare_paired

# The W-router's lambda (accuracy per USD) is swept relative to the median predicted call cost m:
# lambda x m from 1/100 (cost barely matters) to 100 (the cheapest worker always wins), and 0.
LAMBDA_TIMES_MEDIAN_COST = np.geomspace(0.01, 100.0, 21)
CASCADE_THRESHOLDS = np.round(np.linspace(0.0, 1.0, 21), 2)
HINDSIGHT_ARMS = frozenset({OracleRouter.name})
# `cost_story`'s budget: this share of the best single worker's cost per question.
HALF_COST_SHARE = 0.5


def pareto_frontier(points: Mapping[str, tuple[float, float]]) -> list[str]:
    """Arms no other arm beats on both axes: {arm: (cost, accuracy)} -> frontier arms, cheapest first.

    An arm is off the frontier when another costs no more and is at least as accurate, and is
    strictly better on one of the two (equal points: the first name stays).
    """
    ordered = sorted(points, key=lambda arm: (points[arm][0], -points[arm][1], arm))
    frontier: list[str] = []
    best_accuracy = -np.inf
    for arm in ordered:
        accuracy = points[arm][1]
        if accuracy > best_accuracy:
            frontier.append(arm)
            best_accuracy = accuracy
    return frontier


def arms_frontier(table: pl.DataFrame) -> list[str]:
    """The frontier over an arm table's (cost per question, accuracy), hindsight arms left out: the
    oracle routes on answers it could not know and is a bound, not a configuration to buy."""
    return pareto_frontier({
        row["arm"]: (row["cost_per_question"] or 0.0, row["accuracy"])
        for row in table.iter_rows(named=True) if row["arm"] not in HINDSIGHT_ARMS
    })


def lambda_grid(predicted_cost: np.ndarray) -> list[float]:
    """0 and LAMBDA_TIMES_MEDIAN_COST / (median predicted call cost); just 0 when W predicts no cost."""
    known = predicted_cost[np.isfinite(predicted_cost) & (predicted_cost > 0)]
    if known.size == 0:
        return [0.0]
    return [0.0, *(float(x) for x in LAMBDA_TIMES_MEDIAN_COST / np.median(known))]


def cost_sweep(
    workflows: pl.DataFrame,
    predictions: RoutingPredictions,
    *,
    reference: str = REFERENCE_ARM,
    settings: PairedSettings = DEFAULT_PAIRED,
    lambdas: Sequence[float] | None = None,
    thresholds: Sequence[float] = tuple(CASCADE_THRESHOLDS),
) -> pl.DataFrame:
    """One row per configuration (W-router lambda, W-cascade threshold) on the questions every solo
    arm and the reference reached: accuracy, cost per question, its share of the reference's cost,
    and the paired difference to the reference with its verdict. Empty when no question qualifies."""
    solo_arms = [SoloArm(worker).name for worker in predictions.workers]
    scores = question_scores(workflows).filter(pl.col("question_id").is_in(list(predictions.question_ids)))
    questions, aligned = aligned_scores(scores, [*solo_arms, reference])
    if not questions:
        return pl.DataFrame()
    solved = np.column_stack(aligned[:-1])  # questions x workers
    reference_scores = aligned[-1]
    costs = _per_question_costs(workflows, questions, [*solo_arms, reference])
    spent, reference_cost = np.column_stack(costs[:-1]), float(costs[-1].mean())
    routed = predictions.restricted(questions)
    draws = settings.resamples(len(questions))
    rows = []
    index = np.arange(len(questions))

    def add(router: str, knob: str, value: float, chosen: np.ndarray) -> None:
        comparison = compare_paired(solved[index, chosen], reference_scores, confidence=settings.confidence,
                                    resamples=draws)
        cost = float(spent[index, chosen].mean())
        rows.append({
            "router": router, "knob": knob, "value": float(value), "n": len(questions),
            "accuracy": comparison.arm_accuracy, "cost_per_question": cost,
            "cost_share": cost / reference_cost if reference_cost > 0 else None,
            "difference": comparison.difference.value, "difference_low": comparison.difference.low,
            "difference_high": comparison.difference.high, "mcnemar_p": comparison.mcnemar_p,
            "verdict": comparison.verdict, "reference_accuracy": comparison.reference_accuracy,
            "reference_cost_per_question": reference_cost,
        })

    for value in lambda_grid(routed.cost) if lambdas is None else lambdas:
        add(WorldModelRouter.name, "lambda", value, w_router_scores(routed.success, routed.cost, value).argmax(axis=1))
    ladder = sorted(range(len(routed.workers)), key=lambda i: (routed.prices[i], i))
    fallback = routed.workers.index(routed.fallback)
    for value in thresholds:
        add(WCascadeRouter.family, "threshold", value, cascade_choice(routed.success, ladder, fallback, value))
    return pl.DataFrame(rows)


def _per_question_costs(workflows: pl.DataFrame, questions: Sequence[str], arms: Sequence[str]) -> list[np.ndarray]:
    """Each arm's mean cost per question (over repeats), aligned with `questions`."""
    costs = (
        workflows.filter(pl.col("arm").is_in(list(arms)) & pl.col("question_id").is_in(list(questions)))
        .group_by("arm", "question_id")
        .agg(pl.col("cost_usd").fill_null(0.0).mean().alias("score"))
    )
    wide = costs.pivot(on="arm", index="question_id", values="score")
    wide = pl.DataFrame({"question_id": list(questions)}).join(wide, on="question_id", how="left")
    return [wide[arm].fill_null(0.0).to_numpy() for arm in arms]


def cost_story(sweep: pl.DataFrame, router: str = WorldModelRouter.name) -> dict[str, dict | None]:
    """Two answers from one router's sweep:

    - `cheapest_not_worse`: the cheapest configuration the paired interval does not find worse
      than the best single worker (verdict beats or ties);
    - `best_at_half_cost`: the most accurate configuration costing at most half of the best
      single worker's cost per question.
    Either is None when no configuration qualifies.
    """
    rows = sweep.filter(pl.col("router") == router) if sweep.height else sweep
    if rows.height == 0:
        return {"cheapest_not_worse": None, "best_at_half_cost": None}
    not_worse = rows.filter(pl.col("verdict") != "loses").sort(
        ["cost_per_question", "accuracy"], descending=[False, True]
    )
    budget = rows["reference_cost_per_question"][0] * HALF_COST_SHARE
    cheap = rows.filter(pl.col("cost_per_question") <= budget).sort(
        ["accuracy", "cost_per_question"], descending=[True, False]
    )
    return {
        "cheapest_not_worse": not_worse.row(0, named=True) if not_worse.height else None,
        "best_at_half_cost": cheap.row(0, named=True) if cheap.height else None,
    }
