"""The gate check and training read what other processes wrote under the one artifacts root.

On a cluster every step is its own pod and the only thing steps share is the volume the artifacts
root lies on. Here: two `dagster asset materialize` runs with separate Dagster instances and only
$CORYPHAEUS_ARTIFACTS in common (no $CORYPHAEUS_WAREHOUSE: the warehouse follows the root). The
first run's steps are separate processes (Dagster's multiprocess executor): the probe step reads
the contested set the test process wrote and writes the probe manifest, the gate check's process
reads that and writes the verdict. The second run's training step reads the contested set, the
manifest and the verdict the others left there.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from assets.training import contested_set, pass_rates
from conductor_pipeline.corpora.loaders import load_gsm8k
from conductor_pipeline.paths import ARTIFACTS_ENV
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.splits import split_of
from conductor_pipeline.training.gates import evaluate_zero_variance, read_verdict, write_verdict
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.warehouse import Warehouse
from resources.pool import PoolResource
from resources.trainer import TrainerResource
from resources.warehouse import WarehouseResource
from tests.builders import probe_rows
from tests.reliability.dagster_cli import dagster_env, materialize, start_materialize
from tests.shared_data import require_shared_data

POOL = "replay-mixed6"
WEAK = "llama-3.1-8b"
N_TRAIN = 6
TOY_TRAINER = dict(num_generations=4, questions_per_step=2, max_completion_length=16, probe_steps=1, max_steps=1,
                   save_steps=10, sft_warm_start=False)


def step_pids(home: Path) -> dict[str, int]:
    """The process each step of the instance's runs ran in."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return {
            record.dagster_event.step_key: record.dagster_event.pid
            for run in instance.get_runs()
            for record in instance.all_logs(run.run_id)
            if record.dagster_event and record.dagster_event.event_type_value == "STEP_START"
        }


# Slow (two CLI runs, one with a process per step): the gate's verdict and training's reads of it
# under one artifacts root are also covered in-process by tests/assets/test_training_assets.py.
@pytest.mark.slow
def test_gate_and_training_read_what_other_processes_wrote_under_the_artifacts_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_shared_data(monkeypatch, tmp_path / "cache", "gsm8k_test", "zeroeval_outputs")
    shared = tmp_path / "shared-volume"
    monkeypatch.setenv(ARTIFACTS_ENV, str(shared))
    train = [q for q in load_gsm8k("test") if split_of(q.question_id) == "train"][:N_TRAIN]
    store = Warehouse(shared / "warehouse.duckdb")
    store.insert("questions", train)
    # k = 5 samples: every worker right on every question except the weak one, so all are contested.
    store.insert("calls", probe_rows(train, load_pool(POOL).worker_names, POOL, samples=5,
                                     correct=lambda question, worker: worker != WEAK))
    tiny = build_tiny_causal_lm(tmp_path / "tiny")
    resources = {"warehouse": WarehouseResource(), "pool": PoolResource(pool=POOL)}
    assert dg.materialize([contested_set, pass_rates], selection=[contested_set], resources=resources,
                          run_config={"ops": {"contested_set": {"config": {"min_size": 1}}}}).success
    config = {"resources": {"trainer": {"config": {"policy_model": str(tiny), **TOY_TRAINER}}}}

    first_home = tmp_path / "first-instance"
    first = start_materialize("grpo_probe_run", dagster_env(first_home, None, POOL), run_config=config,
                              log_path=tmp_path / "first.log")
    first.wait(timeout=600)
    log = (tmp_path / "first.log").read_text(errors="replace")
    training_dir = TrainerResource(policy_model=str(tiny), **TOY_TRAINER).pool_dir(POOL)  # this seed's folder
    assert training_dir.is_relative_to(shared)
    manifest = json.loads((training_dir / "probe" / "latest_probe.json").read_text())
    verdict = read_verdict(training_dir / "gates" / "zero_variance_gate.json")
    assert verdict is not None, log[-4000:]
    # The untrained toy policy writes no parseable workflow: the check (its own process) judged the
    # probe the probe step (another process) recorded, and closed the gate.
    assert verdict.probe_run_id == manifest["probe_run_id"] and not verdict.passed
    pids = step_pids(first_home)
    assert pids["grpo_probe_run"] != pids["grpo_probe_run_zero_variance_gate"], pids

    # A probe that showed a gradient would have opened the gate: its verdict, for the same probe run.
    write_verdict(training_dir / "gates" / "zero_variance_gate.json", evaluate_zero_variance(
        [{"frac_zero_std": 0.0}], probe_run_id=manifest["probe_run_id"], group_size=4, groups_per_step=2))
    second_home = tmp_path / "second-instance"
    materialize("conductor_checkpoint", dagster_env(second_home, None, POOL),
                run_config=config, log_path=tmp_path / "second.log")
    with dg.DagsterInstance.from_config(str(second_home)) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("conductor_checkpoint"))
        metadata = event.asset_materialization.metadata
    assert metadata["gate"].value["probe_run_id"] == manifest["probe_run_id"]  # the probe the first run made
    checkpoint = Path(metadata["checkpoint_path"].value)
    # grpo/<the run's key>/checkpoint-1, under this seed's folder on the shared volume
    assert checkpoint.parent.parent == training_dir / "grpo" and checkpoint.name == "checkpoint-1"
    assert (checkpoint / "trainer_state.json").is_file()
    assert (shared / "contested_set" / f"{POOL}.json").is_file() and (shared / "warehouse-replica.duckdb").is_file()
