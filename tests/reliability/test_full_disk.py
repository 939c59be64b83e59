"""A full disk while a checkpoint, a warehouse batch and an eval table are written: the previous
state stays whole and loadable, the run fails with a message naming the path, and a rerun after
space is freed resumes.

The full disk is real at the level every writer shares: `enospc_shim.c`, compiled here and loaded
with LD_PRELOAD into the writing subprocess, makes libc's write calls into files whose path
contains ENOSPC_PATH fail with ENOSPC while the file ENOSPC_TRIGGER exists. safetensors, torch,
DuckDB and polars meet the error where a real full disk would give it to them. (A size-limited
tmpfs would need root or a user namespace; the shim needs only a C compiler.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from conductor_pipeline.paths import PROJECT_ROOT
from conductor_pipeline.training.grpo import checkpoint_problem
from tests.reliability.train_driver import train

SHIM_SOURCE = Path(__file__).with_name("enospc_shim.c")
SHIM_VARIABLES = ("LD_PRELOAD", "ENOSPC_PATH", "ENOSPC_TRIGGER")


@pytest.fixture
def full_disk(tmp_path: Path):
    """A function `env(path_part)` giving a subprocess environment whose writes into files whose
    path contains `path_part` fail with ENOSPC while `trigger` exists, and the trigger file."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the ENOSPC shim")
    shim = tmp_path / "libenospc.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(shim), str(SHIM_SOURCE), "-ldl"], check=True)
    trigger = tmp_path / "disk-is-full"

    def env(path_part: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "LD_PRELOAD": str(shim),
                "ENOSPC_PATH": path_part, "ENOSPC_TRIGGER": str(trigger)}

    return env, trigger


def run(argv: list[str], env: dict[str, str], timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def test_a_full_disk_while_a_checkpoint_is_written(tmp_path: Path, full_disk) -> None:
    """Only the run that meets the full disk is a process of its own (the shim fills its disk);
    the runs before and after it train here, on the same driver."""
    from transformers import AutoModelForCausalLM

    from conductor_pipeline.training.tiny_models import build_tiny_causal_lm

    env, trigger = full_disk
    model, out = build_tiny_causal_lm(tmp_path / "model"), tmp_path / "grpo"
    assert train(model, out, max_steps=2).global_step == 2  # checkpoints 1 and 2 on a disk with room
    trigger.touch()
    argv = [sys.executable, "-m", "tests.reliability.train_driver", str(model), str(out), "--max-steps", "3"]
    failed = run(argv, env("/checkpoint-3/"))
    assert failed.returncode != 0
    assert f"no space left on the device while writing checkpoint {out / 'checkpoint-3'}" in failed.stderr, failed.stderr[-3000:]
    assert not (out / "checkpoint-3").exists()  # nothing half-written is kept
    assert checkpoint_problem(out / "checkpoint-2") is None
    AutoModelForCausalLM.from_pretrained(out / "checkpoint-2")  # the previous checkpoint still loads
    trigger.unlink()  # space freed
    resumed = train(model, out, max_steps=3)
    assert (resumed.global_step, resumed.resumed_from) == (3, out / "checkpoint-2")
    assert checkpoint_problem(out / "checkpoint-3") is None


WRITE_BATCHES = """
import sys
from conductor_pipeline.warehouse import Warehouse
path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = Warehouse(path, replica_path=path.replace(".duckdb", "-replica.duckdb"), replica_interval_s=0)
for i in range(first, last):
    workflow = f"w{i}"
    store.insert_tables({
        "workflows": [{"workflow_id": workflow, "run_id": "r", "question_id": "q", "conductor": "c", "parse_code": "ok",
                       "n_steps": 3}],
        "calls": [{"call_id": f"{workflow}-{s}", "run_id": "r", "kind": "step", "question_id": "q", "worker": "x",
                   "sample": 0, "status": "ok", "workflow_id": workflow, "step": s} for s in range(3)],
    })
    print("BATCH", i, flush=True)
"""


def warehouse_rows(path: Path) -> tuple[int, int, int]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(
            "SELECT (SELECT count(*) FROM workflows), (SELECT count(*) FROM calls), "
            "(SELECT count(*) - count(DISTINCT call_id) FROM calls)"
        ).fetchone()


def test_a_full_disk_while_a_warehouse_batch_is_written(tmp_path: Path, full_disk) -> None:
    env, trigger = full_disk
    path = tmp_path / "warehouse.duckdb"
    writer = [sys.executable, "-c", WRITE_BATCHES, str(path)]
    assert run([*writer, "0", "4"], env("warehouse.duckdb")).returncode == 0
    trigger.touch()
    failed = run([*writer, "4", "8"], env("warehouse.duckdb"))
    assert failed.returncode != 0 and "BATCH" not in failed.stdout
    assert f"no space left on the device while writing to the warehouse {path}: free space on that device and rerun " \
        "(its transaction was rolled back: none of its rows landed)" in failed.stderr, failed.stderr[-3000:]
    trigger.unlink()
    assert warehouse_rows(path) == (4, 12, 0)  # the batches before are whole, nothing of the failed one landed
    assert run([*writer, "4", "8"], env("warehouse.duckdb")).returncode == 0  # space freed: the rerun goes on
    assert warehouse_rows(path) == (8, 24, 0)


WRITE_TABLE = """
import sys
import polars as pl
from conductor_pipeline.files import write_parquet_atomic
write_parquet_atomic(pl.DataFrame({"arm": ["solo:a", "solo:b"], "accuracy": [float(sys.argv[2])] * 2}), sys.argv[1], "eval table")
"""


def test_a_full_disk_while_an_eval_table_is_written(tmp_path: Path, full_disk) -> None:
    env, trigger = full_disk
    table = tmp_path / "artifacts" / "eval_tables" / "eval-x_arms.parquet"
    writer = [sys.executable, "-c", WRITE_TABLE, str(table)]
    assert run([*writer, "0.5"], env("/eval_tables/")).returncode == 0
    trigger.touch()
    failed = run([*writer, "0.75"], env("/eval_tables/"))
    assert failed.returncode != 0
    assert f"no space left on the device while writing eval table {table}" in failed.stderr, failed.stderr[-3000:]
    assert pl.read_parquet(table)["accuracy"].to_list() == [0.5, 0.5]  # the previous table, whole
    assert sorted(p.name for p in table.parent.iterdir()) == [table.name]  # no half-written file left
    trigger.unlink()
    assert run([*writer, "0.75"], env("/eval_tables/")).returncode == 0
    assert pl.read_parquet(table)["accuracy"].to_list() == [0.75, 0.75]


@pytest.mark.slow
def test_make_run_on_a_full_disk_fails_naming_the_table_and_a_rerun_resumes(tmp_path: Path, full_disk, monkeypatch) -> None:
    """The real entry point (small settings) with the disk full for eval tables: the run fails in
    `eval_tables`, naming the file; once space is freed the rerun materializes only `eval_tables`."""
    from tests.reliability.main_runs import RUN_TIMEOUT_S, SMALL_RUN, RunFolder, artifact_problems, run_to_end
    from tests.shared_data import require_shared_data

    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train",
                        "zeroeval_outputs")
    env, trigger = full_disk
    folder = RunFolder(tmp_path / "run").prepare()
    trigger.touch()
    argv = SMALL_RUN.argv()
    shim = {key: value for key, value in env("/eval_tables/").items() if key in SHIM_VARIABLES}
    failed = run(argv, {**folder.env(), **shim}, timeout_s=RUN_TIMEOUT_S)
    assert failed.returncode == 1, failed.stdout[-3000:]
    said = re.search(r"step eval_tables failed: .*no space left on the device while writing eval table (\S+):", failed.stdout)
    assert said and said[1].startswith(str(folder.artifacts / "eval_tables")), failed.stdout[-3000:]
    assert "FAILED steps: eval_tables" in failed.stdout
    trigger.unlink()
    log = folder.root / "rerun.log"
    run_to_end(folder, SMALL_RUN, log)
    rerun = log.read_text()
    assert "== eval_job: 1 to materialize" in rerun and "eval_tables: never materialized" in rerun
    assert not artifact_problems(folder)[0]
