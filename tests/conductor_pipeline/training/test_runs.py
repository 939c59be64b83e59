"""What a GRPO run records and how the gate reads it: `training_steps` rows, the probe manifest,
and the training data's refusals (missing contested set, questions outside the train split)."""

from __future__ import annotations

import json
import math

import pytest

from conductor_pipeline.splits import split_of
from conductor_pipeline.training.dataset import (
    TrainingDataError,
    contested_questions,
    contested_set_paths,
    flat_groups,
    read_contested_manifest,
)
from conductor_pipeline.training.gates import judge_probe, probe_manifest, read_probe_manifest, write_probe_manifest
from conductor_pipeline.training.runs import format_metric, parse_code_totals, progress_figures, training_steps_row
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.warehouse import Warehouse


def test_training_steps_row_derives_the_parse_failure_rate_over_scored_rollouts_only():
    counts = {"ok": 3, "schema": 1, "infrastructure": 4}
    row = training_steps_row("r", "probe", {"step": 2.0, "parse_code_counts": counts, "reward_mean": 0.5})
    assert row["step"] == 2 and row["phase"] == "probe" and row["reward_mean"] == 0.5
    assert row["parse_fail_rate"] == 1 / 4  # 1 failure of 4 scored rollouts; infrastructure is not scored
    assert json.loads(row["parse_codes"]) == counts
    logged = training_steps_row("r", "grpo", {"step": 1, "parse_code_counts": counts, "parse_fail_rate": 0.9})
    assert logged["parse_fail_rate"] == 0.9  # the reward's own figure wins
    only_infra = training_steps_row("r", "grpo", {"step": 1, "parse_code_counts": {"infrastructure": 2}})
    assert only_infra["parse_fail_rate"] is None
    assert training_steps_row("r", "grpo", {"step": 1})["parse_fail_rate"] is None


def test_parse_code_totals_and_format_metric():
    assert parse_code_totals(['{"ok": 2, "schema": 1}', None, '{"ok": 1}', ""]) == {"ok": 3, "schema": 1}
    assert format_metric(None) == "-" and format_metric(math.nan) == "-"
    assert format_metric(0.12345) == "0.123" and format_metric(3) == "3"


def test_the_gate_judges_a_probe_by_its_manifest_and_logged_steps(tmp_path):
    steps = [
        {"step": 1, "frac_zero_std": 0.0, "frac_groups_no_signal": 0.5, "reward_mean": 0.2},
        {"step": 2, "frac_zero_std": 0.0, "frac_groups_no_signal": 0.0},
    ]
    manifest = probe_manifest("p1", steps, group_size=4, groups_per_step=2, trained_questions=6)
    assert manifest["steps"][0] == {"step": 1, "frac_zero_std": 0.0, "frac_groups_no_signal": 0.5}
    assert manifest["trained_questions"] == 6
    assert read_probe_manifest(tmp_path) is None
    write_probe_manifest(tmp_path, manifest)
    assert read_probe_manifest(tmp_path) == manifest
    logged = [{"step": 1, "frac_zero_std": 0.0}, {"step": 2, "frac_zero_std": 0.0}]
    verdict = judge_probe(manifest, logged, threshold=0.2)
    assert verdict.figure == 0.25 and not verdict.passed  # ours (0.5 at step 1) wins over TRL's 0.0
    low, high = verdict.interval  # 1 flat group of 4: a probe that cannot tell 0.25 from 0.2
    assert verdict.summary() == {"zero_variance_fraction": 0.25, "group_size": 4, "groups": 4, "steps": 2,
                                 "threshold": 0.2, "probe_run_id": "p1", "gate_on": "reward",
                                 "flat_reward_fraction": 0.25, "same_correctness_fraction": None,
                                 "interval": [low, high], "decided": False}
    assert low < 0.2 < 0.25 < high


def test_flat_groups_counts_questions_with_two_or_more_equal_rewards():
    assert flat_groups({"a": [0.5, 0.5], "b": [0.0, 1.0], "c": [1.0]}) == {"observed": 2, "zero_variance": 1}


def test_contested_set_refusals_name_the_file_and_the_questions(tmp_path):
    with pytest.raises(TrainingDataError, match="no contested set for pool 'p' at .*p.json: materialize contested_set first"):
        read_contested_manifest(tmp_path, "p")
    _, manifest_path = contested_set_paths(tmp_path, "p")
    manifest_path.write_text(json.dumps({"question_ids": ["test/algebra/1.json"]}))
    assert read_contested_manifest(tmp_path, "p") == {"question_ids": ["test/algebra/1.json"]}

    store = Warehouse(tmp_path / "w.duckdb")
    eval_id = next(f"gsm8k:test:{i}" for i in range(1000) if split_of(f"gsm8k:test:{i}") == "eval")
    train_id = next(f"gsm8k:test:{i}" for i in range(1000) if split_of(f"gsm8k:test:{i}") == "train")
    with pytest.raises(TrainingDataError, match="1 contested questions are not in the train split"):
        contested_questions(store, {"question_ids": [eval_id]})
    with pytest.raises(TrainingDataError, match="1 contested questions are missing from the questions table"):
        contested_questions(store, {"question_ids": [train_id]})


def test_progress_says_the_step_the_rate_and_the_reward_trend():
    settings = GRPOSettings.cpu_paper_profile()
    steps = [
        {"step": i, "reward_mean": 0.4 + 0.01 * i, "parse_fail_rate": 0.1,
         "trl_logs": {"conductor/parsed_accuracy": 0.5 if i <= 10 else 0.7}}
        for i in range(1, 31)
    ]
    figures = progress_figures(steps, elapsed_s=60.0, settings=settings)
    assert figures["step"] == 30 and figures["max_steps"] == 200 and figures["window"] == 10
    assert figures["rollouts_per_s"] == 30 * 256 / 60.0
    assert figures["reward_first"] == pytest.approx(0.455) and figures["reward_recent"] == pytest.approx(0.655)
    assert figures["parsed_accuracy_first"] == 0.5 and figures["parsed_accuracy_recent"] == pytest.approx(0.7)
    early = progress_figures(steps[:3], elapsed_s=6.0, settings=settings)
    assert early["window"] == 3 and early["reward_first"] == early["reward_recent"]



def test_a_run_without_constrained_decoding_keeps_the_recipe_it_had_and_one_with_it_gets_another():
    """The knobs came after runs were recorded: off, a run's recipe (its key) is what it was before."""
    from dataclasses import asdict, replace

    from conductor_pipeline.training.runs import RUN_LENGTH_SETTINGS, run_recipe

    settings = GRPOSettings.cpu_paper_profile()
    later = ("constrained_decoding", "fan_outs_only", "max_pool_size")
    before = {k: v for k, v in asdict(settings).items() if k not in RUN_LENGTH_SETTINGS and k not in later}
    assert run_recipe(settings) == before
    assert run_recipe(replace(settings, constrained_decoding=True)) == {**before, "constrained_decoding": True}
    both = replace(settings, constrained_decoding=True, fan_outs_only=True)
    assert run_recipe(both) == {**before, "constrained_decoding": True, "fan_outs_only": True}
    assert run_recipe(replace(settings, max_pool_size=8)) == {**before, "max_pool_size": 8}
