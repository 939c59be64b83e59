"""The probe stage's two ways in: a finished probe of the same inputs is read back without sampling
anything; an unfinished one (a killed run) starts again from scratch, its logged rows deleted first.

The stages' training paths (a probe run, GRPO resumed, the warm start between its parse checks) run
end to end through the assets in tests/assets/test_training_assets.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.training.dataset import TrainingSet
from conductor_pipeline.training.gates import RUN_MANIFEST, probe_manifest, write_probe_manifest
from conductor_pipeline.training.runs import training_steps_row
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.training.stages import PROBE_PHASE, GRPORun, probe_once
from conductor_pipeline.warehouse import Warehouse

RUN_ID = "probe-replay-mixed6-0123456789abcdef"
SETTINGS = GRPOSettings(max_steps=2)


class ExecutorBuilt(Exception):
    """Raised where the stage asks for the pool's rollouts: the point past which it samples."""


def refuse_to_sample(log) -> None:
    raise ExecutorBuilt(log.run_id)


def _stage(tmp_path: Path, logged_steps: int) -> tuple[GRPORun, TrainingSet]:
    """A probe run whose folder holds a manifest of `logged_steps` steps, with those steps' rows logged."""
    store = Warehouse(tmp_path / "warehouse.duckdb")
    steps = range(1, logged_steps + 1)
    rows = [training_steps_row(RUN_ID, PROBE_PHASE, {"step": step, "frac_zero_std": 0.5}) for step in steps]
    store.insert("training_steps", rows)
    run = GRPORun(PROBE_PHASE, RUN_ID, tmp_path / "probe" / RUN_ID, "policy", SETTINGS, "cpu")
    manifest = probe_manifest(
        RUN_ID, rows, group_size=SETTINGS.num_generations, groups_per_step=2, dagster_run_id="earlier"
    )
    write_probe_manifest(run.output_dir, manifest, RUN_MANIFEST)
    return run, TrainingSet(load_pool("replay-mixed6"), store, questions=[])


def _logged_steps(store: Warehouse) -> int:
    return store.query("SELECT count(*) AS n FROM training_steps WHERE run_id = ?", [RUN_ID])["n"][0]


def test_a_finished_probe_of_the_same_inputs_is_read_back_without_sampling(tmp_path: Path) -> None:
    run, training = _stage(tmp_path, logged_steps=SETTINGS.max_steps)
    lines: list[str] = []
    manifest = probe_once(
        run, training, refuse_to_sample, prune_audit_questions=0, dagster_run_id="now", log=lines.append
    )
    assert manifest["dagster_run_id"] == "earlier"
    assert len(manifest["steps"]) == SETTINGS.max_steps
    assert any("already finished" in line for line in lines)
    assert _logged_steps(training.store) == SETTINGS.max_steps


def test_an_unfinished_probe_forgets_its_rows_before_it_samples_again(tmp_path: Path) -> None:
    run, training = _stage(tmp_path, logged_steps=SETTINGS.max_steps - 1)
    with pytest.raises(ExecutorBuilt, match=RUN_ID):
        probe_once(run, training, refuse_to_sample, prune_audit_questions=0, dagster_run_id="now", log=print)
    assert _logged_steps(training.store) == 0
