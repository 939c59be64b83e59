"""Every arm against the best single worker on workflows with planted outcomes, and a conductor's
gap split into points that add up."""

from __future__ import annotations

import polars as pl
import pytest

from conductor_pipeline.evaluation.comparisons import (
    PairedSettings,
    compare_with_reference,
    comparisons_frame,
    gap_in_points,
)
from tests.builders import eval_workflow_rows, eval_workflows_frame

N = 200
BEST = [i < 100 for i in range(N)]  # the best single worker solves q000-q099


def planted_run() -> pl.DataFrame:
    vote = [i < 130 for i in range(N)]  # 30 more questions: +15 points
    worse = [30 <= i < 100 for i in range(N)]  # 30 fewer: -15 points
    oracle = [i < 150 for i in range(N)]  # 50 points of headroom
    flaky = [*BEST[:-1], None]  # the last question hit an infrastructure failure
    return eval_workflows_frame(
        eval_workflow_rows("best_single", BEST),
        eval_workflow_rows("solo:gpt", BEST),
        eval_workflow_rows("vote:all", vote),
        eval_workflow_rows("random", worse),
        eval_workflow_rows("oracle", oracle),
        eval_workflow_rows("solo:flaky", flaky),
    )


def test_planted_differences_are_found_and_an_identical_arm_ties():
    comparisons = compare_with_reference(planted_run(), settings=PairedSettings(n_resamples=1000))
    assert set(comparisons) == {"solo:gpt", "vote:all", "random", "oracle", "solo:flaky"}
    vote = comparisons["vote:all"]
    assert vote.verdict == "beats" and vote.difference.value == pytest.approx(0.15)
    assert vote.difference.low > 0 and (vote.arm_only, vote.reference_only) == (30, 0)
    assert vote.mcnemar_p == pytest.approx(2 * 0.5**30)
    assert vote.headroom_recovered.value == pytest.approx(30 / 50)
    assert comparisons["random"].verdict == "loses" and comparisons["random"].difference.high < 0
    same = comparisons["solo:gpt"]
    assert same.verdict == "ties" and same.difference.low <= 0 <= same.difference.high
    assert comparisons["oracle"].headroom_recovered.value == pytest.approx(1.0)
    # Only the questions both reached: the flaky arm's failed question is left out of its pair.
    assert comparisons["solo:flaky"].n_questions == N - 1 and comparisons["vote:all"].n_questions == N
    frame = comparisons_frame(comparisons)
    assert frame.height == 5 and set(frame["verdict"]) == {"beats", "ties", "loses"}


def test_a_conductors_gap_splits_into_points_that_add_up():
    best = [True, True, False, False]
    runs = eval_workflows_frame(
        eval_workflow_rows("best_single", best),
        eval_workflow_rows("solo:a", [True, True, False, False]),
        eval_workflow_rows("solo:b", [False, True, True, False]),
        # repeat 0: unparseable; reached solver b (right); only non-solver a (wrong); nobody solves q3.
        eval_workflow_rows("conductor:c", [False, True, False, False], workers=[[], ["b"], ["a"], ["a"]],
                           parse_codes=["json_decode", "ok", "ok", "ok"]),
        # repeat 1: reached solver a (right); unparseable; reached solver b (right, best was wrong); wrong.
        eval_workflow_rows("conductor:c", [True, False, True, False], workers=[["a"], [], ["b"], ["b"]],
                           parse_codes=["ok", "no_workflow", "ok", "ok"], repeat=1),
    )
    split = gap_in_points(runs, "conductor:c")
    assert split["conductor"] == pytest.approx(0.375) and split["reference"] == pytest.approx(0.5)
    assert split["gap"] == pytest.approx(-0.125)
    assert split["parts"] == pytest.approx({"unparseable": -0.25, "no_solver": 0.0, "solver": 0.125})
    assert sum(split["parts"].values()) == pytest.approx(split["gap"])
    assert split["workflows"] == {"unparseable": 2, "no_solver": 3, "solver": 3}
    assert gap_in_points(runs, "conductor:absent") is None
