"""The cost story on a planted pool: a cheap worker that solves half the questions and a dear one
that solves nearly all. Routing the cheap half to the cheap worker matches the dear worker at 55%
of its cost; nothing reaches half its cost without losing."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from conductor_pipeline.evaluation.comparisons import PairedSettings
from conductor_pipeline.evaluation.costs import (
    arms_frontier,
    cost_story,
    cost_sweep,
    lambda_grid,
    pareto_frontier,
)
from conductor_pipeline.evaluation.frames import arm_table
from conductor_pipeline.evaluation.plots import accuracy_cost_plot
from conductor_pipeline.evaluation.routing_predictions import RoutingPredictions
from tests.builders import eval_workflow_rows, eval_workflows_frame

N = 200
EASY = np.arange(N) < 100  # the cheap worker solves exactly these
DEAR_SOLVES = [not (100 <= i < 120) for i in range(N)]


def planted() -> tuple[pl.DataFrame, RoutingPredictions]:
    workflows = eval_workflows_frame(
        eval_workflow_rows("solo:cheap", EASY.tolist(), costs=0.001),
        eval_workflow_rows("solo:dear", DEAR_SOLVES, costs=0.01),
        eval_workflow_rows("best_single", DEAR_SOLVES, costs=0.01),
    )
    success = np.column_stack([np.where(EASY, 0.9, 0.1), np.full(N, 0.95)])
    predictions = RoutingPredictions(
        question_ids=tuple(f"q{i:03d}" for i in range(N)), workers=("cheap", "dear"), success=success,
        cost=np.tile([0.001, 0.01], (N, 1)), prices=(0.4, 12.0), fallback="dear",
    )
    return workflows, predictions


def test_the_sweep_finds_the_cheapest_configuration_that_is_not_worse_and_none_at_half_the_cost():
    workflows, predictions = planted()
    sweep = cost_sweep(workflows, predictions, settings=PairedSettings(n_resamples=500))
    assert set(sweep["router"]) == {"w_router", "w_cascade"} and set(sweep["n"]) == {N}
    at_zero = sweep.filter((pl.col("router") == "w_router") & (pl.col("value") == 0.0)).row(0, named=True)
    assert at_zero["accuracy"] == pytest.approx(0.9) and at_zero["cost_share"] == pytest.approx(1.0)
    for router in ("w_router", "w_cascade"):
        story = cost_story(sweep, router)
        cheapest = story["cheapest_not_worse"]
        assert cheapest["verdict"] == "ties" and cheapest["accuracy"] == pytest.approx(0.9)
        assert cheapest["cost_share"] == pytest.approx(0.55)
        half = story["best_at_half_cost"]  # only "always the cheap worker" is that cheap, and it loses
        assert half["cost_share"] == pytest.approx(0.1) and half["accuracy"] == pytest.approx(0.5)
        assert half["verdict"] == "loses"
    empty = cost_story(pl.DataFrame(), "w_router")
    assert empty == {"cheapest_not_worse": None, "best_at_half_cost": None}


def test_a_configuration_whose_interval_lies_below_the_reference_is_never_called_not_worse():
    """The sweep serves a not-worse claim, so its verdicts are left unadjusted: a correction for the
    many configurations would call a configuration whose whole interval is below the reference a tie.
    W here rates the cheap worker ever lower on the questions only the dear one solves, so each step
    of lambda hands it a few more of them: configurations a few points worse, by a few questions."""
    workflows, predictions = planted()
    cheap = np.where(EASY, 0.9, 0.1)
    cheap[120:] = np.linspace(0.9, 0.1, N - 120)
    graded = RoutingPredictions(
        question_ids=predictions.question_ids, workers=predictions.workers, cost=predictions.cost,
        success=np.column_stack([cheap, np.full(N, 0.95)]), prices=predictions.prices, fallback=predictions.fallback,
    )
    sweep = cost_sweep(workflows, graded, settings=PairedSettings(n_resamples=500))
    below = sweep.filter(pl.col("difference_high") < 0)
    assert below.filter(pl.col("difference") > -0.04).height > 0  # a marginal one, by six questions or fewer
    assert set(below["verdict"]) == {"loses"}


def test_lambda_grid_scales_with_the_predicted_cost_and_is_zero_without_one():
    grid = lambda_grid(np.array([[0.001, 0.01]]))
    assert grid[0] == 0.0 and len(grid) == 22 and grid[-1] == pytest.approx(100 / 0.0055)
    assert lambda_grid(np.full((3, 2), np.nan)) == [0.0]


def test_the_frontier_keeps_only_arms_nothing_beats_on_cost_and_accuracy():
    points = {"cheap": (0.001, 0.5), "mid": (0.005, 0.8), "dear": (0.01, 0.9), "waste": (0.02, 0.85),
              "same_as_mid": (0.005, 0.7), "free": (0.0, 0.0)}
    assert pareto_frontier(points) == ["free", "cheap", "mid", "dear"]


def test_the_oracle_is_a_bound_not_a_point_of_the_arms_frontier():
    workflows, _ = planted()
    oracle = eval_workflow_rows("oracle", [True] * N, costs=0.002)
    table = arm_table(eval_workflows_frame(workflows.to_dicts(), oracle), planned_size=N)
    # best_single and solo:dear are one point: the first name stands for it.
    assert arms_frontier(table) == ["solo:cheap", "best_single"]


def test_the_accuracy_cost_plot_draws_arms_frontier_and_sweeps():
    workflows, predictions = planted()
    table = arm_table(workflows, planned_size=N)
    sweep = cost_sweep(workflows, predictions, settings=PairedSettings(n_resamples=100))
    png = accuracy_cost_plot(table, frontier=["solo:cheap", "solo:dear"], sweep=sweep, reference="best_single",
                             labels={"best_single": "best_single (dear)"})
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
