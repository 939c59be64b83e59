"""The evaluation's markdown: one rounding everywhere, n/a instead of blanks, verdict lines short
enough for the UI, and the routing summary's figures with their populations."""

from __future__ import annotations

import polars as pl

from conductor_pipeline.evaluation.frames import arm_table
from conductor_pipeline.evaluation.markdown import (
    arm_labels,
    arm_table_markdown,
    conductor_summary,
    fmt_cost,
    fmt_p,
    fmt_points,
    routing_summary_markdown,
    verdict_lines,
)
from conductor_pipeline.stats import Estimate, PairedComparison
from tests.builders import eval_workflow_rows, eval_workflows_frame


def comparison(difference: float, low: float, high: float, *, n: int = 384) -> PairedComparison:
    return PairedComparison(
        n_questions=n, arm_accuracy=0.523 + difference, reference_accuracy=0.523,
        difference=Estimate(difference, low, high), arm_only=40, reference_only=13, mcnemar_p=0.0002,
        headroom_recovered=Estimate(0.3, 0.1, 0.5), p_value=0.0002 if low > 0 or high < 0 else 0.5,
    )


def test_numbers_are_rounded_one_way_and_costs_never_read_zero():
    assert fmt_cost(0.0000892) == "0.0000892" and fmt_cost(0.00357) == "0.00357" and fmt_cost(1.5684) == "1.57"
    assert fmt_cost(0.0) == "0" and fmt_cost(None) == "n/a"
    assert fmt_points(0.06521739130434781) == "+6.5" and fmt_points(-0.1) == "-10.0"
    assert fmt_p(0.0002) == "<0.001" and fmt_p(0.0123) == "0.012"


def test_the_arm_table_says_n_a_and_marks_estimated_tokens():
    workflows = eval_workflows_frame(
        eval_workflow_rows("solo:a", [True, False], costs=0.00012), eval_workflow_rows("best_single", [True, True])
    )
    tokens = pl.DataFrame(
        {"workflow_id": workflows["workflow_id"], "tokens": [100.0] * 4, "tokens_estimated": [True] * 4}
    )
    table = arm_table(workflows, planned_size=2, call_tokens=tokens)
    text = arm_table_markdown(table, arm_labels(table["arm"].to_list(), best_single_worker="a", replayed=True))
    assert "best_single (a)" in text and "| est. " in text and "characters / 4" in text
    assert "| n/a " in text  # replay records no latency
    assert "| 0.000120 " in text and "|  |" not in text  # a small cost keeps its digits; no blank cell


def test_verdict_lines_fit_the_inline_limit_by_dropping_detail():
    arms = [f"solo:worker-with-a-long-name-{i}" for i in range(20)]
    comparisons = {arm: comparison(0.05, 0.01, 0.09) for arm in arms}
    labels = {arm: arm for arm in arms}
    full = verdict_lines(comparisons, arms, labels, reference_label="best_single (a)")
    assert full.count("\n- ") == 20 and "[+1.0, +9.0]" in full and "pts, p <0.001" in full
    assert "McNemar" not in full and "Holm-adjusted over 20 arms" in full
    fitted = verdict_lines(comparisons, arms, labels, reference_label="best_single (a)", max_chars=1000)
    assert len(fitted) < 1000 and "**beats**" in fitted
    fifteen = verdict_lines({f"arm:{i}": comparisons[arms[0]] for i in range(15)}, [f"arm:{i}" for i in range(15)],
                            {}, reference_label="best_single (a)", max_chars=1000)
    assert len(fifteen) < 1000 and "- arm:14: **beats** +5.0 [+1.0, +9.0] pts" in fifteen  # interval kept, p dropped
    few = verdict_lines(
        {"vote:all": comparison(0.07, 0.04, 0.10)}, ["vote:all"], {"vote:all": "vote:all (from recordings)"},
        reference_label="best_single (a)", max_chars=1000,
    )
    assert "- vote:all (from recordings): **beats** +7.0 [+4.0, +10.0] pts" in few


def test_the_conductor_summary_states_the_verdict_and_the_points_that_add_up():
    split = {"gap": -0.143, "parts": {"unparseable": -0.081, "no_solver": -0.040, "solver": -0.022},
             "workflows": {"unparseable": 31, "no_solver": 40, "solver": 313}}
    text = conductor_summary({"conductor:x": comparison(-0.143, -0.19, -0.09)}, ["conductor:x"], {"conductor:x": split},
                             reference_label="best_single (a)")
    assert "**conductor:x**" in text and "**loses**" in text and "-14.3 [-19.0, -9.0] pts" in text
    assert "-8.1 (unparseable workflows) -4.0" in text and "= -14.3." in text
    assert conductor_summary({}, [], {}, reference_label="x") == "no conductor arm in this run"


def test_the_conductor_summary_fits_the_inline_limit_whatever_the_number_of_conductor_arms():
    split = {"gap": -0.143, "parts": {"unparseable": -0.081, "no_solver": -0.040, "solver": -0.022},
             "workflows": {"unparseable": 31, "no_solver": 40, "solver": 313}}
    arms = [f"conductor:hf:checkpoint-{n}+W-ranked{suffix}" for n in (120, 240, 360) for suffix in ("", "@shuffled")]
    comparisons = {arm: comparison(-0.143, -0.19, -0.09) for arm in arms}
    full = conductor_summary(comparisons, arms, dict.fromkeys(arms, split), reference_label="best_single (gpt-4o)")
    assert len(full) > 1000 and "Gap in points" in full
    for limit in (1000, 600, 300):
        fitted = conductor_summary(comparisons, arms, dict.fromkeys(arms, split), reference_label="best_single (gpt-4o)",
                                   max_chars=limit)
        assert len(fitted) <= limit or limit == 300  # the shortest form keeps every arm's verdict, however long
        assert all(f"**{arm}**" in fitted for arm in arms) and fitted.count("**loses**") == len(arms)
    assert "Gap in points" not in conductor_summary(comparisons, arms, dict.fromkeys(arms, split),
                                                    reference_label="best_single (gpt-4o)", max_chars=1000)


def test_the_routing_summary_reconciles_the_eval_slice_the_report_and_the_ceilings():
    report = {"questions": 2040, "population": "2040 questions (gsm8k 1319, math L5 721)", "w_router": 0.807,
              "best_single": 0.817, "oracle": 0.910, "headroom_recovered": [-0.099, -0.194, 0.005]}
    text = routing_summary_markdown(
        pool="replay-mixed6", eval_population="math level 5, eval split", w_router=comparison(0.016, -0.01, 0.04),
        oracle_accuracy=0.763, report=report, ceilings={"n_questions": 2040, "best_single": 0.8167, "oracle": 0.9103},
    )
    for expected in ("eval_tables (this run)", "world_model_report (latest)", "oracle_ceilings (latest)",
                     "math level 5, eval split", "2040 questions (gsm8k 1319, math L5 721)", "-1.0",
                     "-9.9% [-19.4%, +0.5%]", "0.817", "0.910", "Why the figures differ"):
        assert expected in text, expected
    missing = routing_summary_markdown(pool="p", eval_population="x", w_router=None, oracle_accuracy=None,
                                       report=None, ceilings=None)
    assert "not materialized" in missing and "no W-router arm" in missing
