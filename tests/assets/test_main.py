"""`make run` tells a closed gate (a result) from a broken step (a fault), and every headline it
prints is an entry its asset really publishes."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import dagster as dg
import pytest
from dagster._utils.error import SerializableErrorInfo

from assets.definitions import MAIN_JOBS, build_definitions
from assets.main import HEADLINES, is_blocking_check_failure, print_headlines
from assets.metadata import latest_metadata
from assets.probing import PROBE_CALLS, all_probe_partitions_tags
from conductor_pipeline.training.gates import evaluate_zero_variance, write_verdict
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.trainer import TrainerResource
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

POOL = "replay-mixed6"
# A whole run at toy sizes: a 60-question probe slice, a pool search over 200 questions, 2 GRPO steps
# of 2 questions x 4 rollouts, a 4-question eval slice, a world model on 2 x 2 folds.
TOY_TRAINER = dict(num_generations=4, questions_per_step=2, max_completion_length=24, probe_steps=1, max_steps=1,
                   save_steps=10, sft_warm_start=False)
FAST_WORLD_MODEL = {"num_threads": 1, "text_components": 8, "question_folds": 2, "worker_folds": 2, "n_bootstrap": 10}
OP_CONFIG = {
    "probe_calls": {"max_questions": 60},
    "contested_set": {"min_size": 1},
    "pool_search": {"max_questions": 200, "n_bootstrap": 50},
    "world_model": FAST_WORLD_MODEL,
    "world_model_report": FAST_WORLD_MODEL,
    "eval_arms": {"slice_size": 4, "world_model": {"num_threads": 1}},
}
TRAINING_ONLY_JOB = "conductor_checkpoint_only"


def error(cls_name: str, cause: SerializableErrorInfo | None = None) -> SerializableErrorInfo:
    return SerializableErrorInfo(message=f"{cls_name}: boom", stack=[], cls_name=cls_name, cause=cause)


def test_a_failed_blocking_check_is_a_gate_not_a_fault():
    assert is_blocking_check_failure(error("DagsterAssetCheckFailedError"))
    assert is_blocking_check_failure(error("DagsterExecutionStepExecutionError", error("DagsterAssetCheckFailedError")))


def test_any_other_step_error_is_a_fault():
    assert not is_blocking_check_failure(error("ValueError"))
    assert not is_blocking_check_failure(error("DagsterExecutionStepExecutionError", error("KeyError")))


def run_job(defs: dg.Definitions, name: str, instance: dg.DagsterInstance, **options) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def(name)
    ops = {op: {"config": config} for op, config in OP_CONFIG.items() if job.graph.has_node_named(op)}
    return job.execute_in_process(instance=instance, run_config={"ops": ops}, raise_on_error=False, **options)


def open_gate_for_latest_probe(instance: dg.DagsterInstance, trainer: TrainerResource) -> None:
    """The verdict the gate writes when the probe shows a gradient, for the probe just run.

    The untrained toy policy never writes a parseable workflow, so its own probe closes the gate.
    """
    probe_run_id = latest_metadata(instance, "grpo_probe_run")["probe_run_id"].value
    verdict = evaluate_zero_variance([{"frac_zero_std": 0.0}], probe_run_id=probe_run_id,
                                     group_size=TOY_TRAINER["num_generations"],
                                     groups_per_step=TOY_TRAINER["questions_per_step"])
    write_verdict(trainer.gate_path(POOL), verdict)


def test_every_headline_is_an_entry_its_asset_publishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train",
                        "zeroeval_outputs")
    tiny = build_tiny_causal_lm(tmp_path / "tiny")
    trainer = TrainerResource(output_root=str(tmp_path / "training"), policy_model=str(tiny), **TOY_TRAINER)
    project = build_definitions(POOL)
    defs = dg.Definitions(  # the project's definitions with toy resources
        assets=project.assets,
        asset_checks=project.asset_checks,
        jobs=[*project.jobs, dg.define_asset_job(TRAINING_ONLY_JOB, selection=["conductor_checkpoint"])],
        resources={
            "warehouse": WarehouseResource(database=str(tmp_path / "warehouse" / "warehouse.duckdb")),
            "pool": PoolResource(pool=POOL),
            "trainer": trainer,
            "conductor": ConductorPolicyResource(model_path=str(tiny), max_new_tokens=24, n_examples=1),
        },
    )
    all_partitions = all_probe_partitions_tags(defs.get_assets_def(PROBE_CALLS).partitions_def)
    with dg.DagsterInstance.ephemeral() as instance:
        for job in MAIN_JOBS:
            result = run_job(defs, job.name, instance, tags=all_partitions if job.name == "probe_job" else None)
            failures = [e.step_failure_data.error for e in result.all_events if e.is_step_failure]
            assert not [f.message for f in failures if not is_blocking_check_failure(f)], job.name
            if job.name == "analysis_job":
                open_gate_for_latest_probe(instance, trainer)
                assert run_job(defs, TRAINING_ONLY_JOB, instance).success

        for asset, entries in HEADLINES:
            metadata = latest_metadata(instance, asset)
            assert metadata is not None, f"{asset} was not materialized"
            missing = [entry for entry in entries if entry not in metadata]
            assert not missing, f"{asset} publishes no {missing} (it publishes {sorted(metadata)})"

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            print_headlines(instance)
    for asset, entries in HEADLINES:
        assert f"### {asset}\n" in printed.getvalue()
        for entry in entries:
            assert f"\n{entry}:" in printed.getvalue(), (asset, entry)
