"""Files that are damaged, stale or hostile: each is recomputed (saying why) or refused with an
error that names it and says what to do; none turns into a silent wrong number.

| file | what happens |
|---|---|
| a truncated Parquet table (the graded-recordings cache) | recomputed, with a log line naming the file |
| a truncated or partly written checkpoint | skipped, naming the file; training resumes from the last whole one |
| a truncated warehouse | refused, naming the file, its replica and the two ways out |
| the replica, replaced while it is read | a reader sees a whole, consistent copy every time |
| a lock file of a dead process | taken over, saying whose it was; the warehouse lock is free at once |
| the pool file, changed while a run is going | the next step that reads it refuses, naming it |
| a truncated gate verdict (or any JSON artifact read through `read_json_checked`) | refused, naming the file |

(The world model's damaged, foreign and pickled files: `tests/conductor_pipeline/world_model/test_persistence.py`.)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from conductor_pipeline.corpora.loaders import load_gsm8k
from conductor_pipeline.locks import held_lock, read_holder
from conductor_pipeline.paths import POOLS_DIR, PROJECT_ROOT
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.probing.recorded_outcomes import recorded_sample_outcomes
from conductor_pipeline.warehouse import Warehouse, WarehouseDamagedError
from resources.pool import PoolResource
from tests.reliability.test_kill import fake_checkpoint
from tests.reliability.train_driver import train
from tests.shared_data import require_shared_data


def test_a_truncated_parquet_cache_is_recomputed_saying_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs", "gsm8k_test")
    pool, questions = load_pool("replay-mixed6"), load_gsm8k("test")[:12]
    first, cached = recorded_sample_outcomes(pool, questions, cache_dir=tmp_path / "outcomes", grade_processes=1)
    assert not cached
    [cache] = (tmp_path / "outcomes").glob("*.parquet")
    cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])
    lines: list[str] = []
    again, cached = recorded_sample_outcomes(pool, questions, cache_dir=tmp_path / "outcomes", grade_processes=1,
                                             log=lines.append)
    assert not cached and again.equals(first)
    assert str(cache) in lines[0] and "damaged or truncated" in lines[0] and "grading the recordings again" in lines[0]
    assert recorded_sample_outcomes(pool, questions, cache_dir=tmp_path / "outcomes")[1]  # whole again: read back


def test_training_resumes_from_the_last_whole_checkpoint_when_the_latest_is_truncated(tmp_path: Path) -> None:
    """A real GRPO run (the kill test's driver, a checkpoint every step): truncate the latest
    checkpoint's weights, and the rerun resumes from the one before, saying which file it skipped."""
    from conductor_pipeline.training.tiny_models import build_tiny_causal_lm

    model, out = build_tiny_causal_lm(tmp_path / "model"), tmp_path / "grpo"
    assert train(model, out, max_steps=2).global_step == 2
    weights = out / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    lines: list[str] = []
    resumed = train(model, out, max_steps=3, log=lines.append)
    assert (resumed.global_step, resumed.resumed_from) == (3, out / "checkpoint-1")
    assert f"skipping checkpoint {out / 'checkpoint-2'}: {weights} has 1000 bytes" in "\n".join(lines)


def test_a_half_written_checkpoint_folder_is_never_taken_as_complete(tmp_path: Path) -> None:
    from conductor_pipeline.training.grpo import last_checkpoint

    whole = fake_checkpoint(tmp_path, 1, sealed=True)
    fake_checkpoint(tmp_path, 2, sealed=False)  # every file the Trainer writes, the manifest not yet
    assert last_checkpoint(tmp_path) == whole


def test_a_truncated_warehouse_is_refused_naming_it_its_replica_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "warehouse.duckdb"
    store = Warehouse(path, replica_path=tmp_path / "warehouse-replica.duckdb", replica_interval_s=0)
    store.insert("questions", load_gsm8k_rows(400))
    assert store.refresh_replica() or (tmp_path / "warehouse-replica.duckdb").is_file()
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    size = path.stat().st_size
    with pytest.raises(WarehouseDamagedError) as refused:
        Warehouse(path, replica_path=tmp_path / "warehouse-replica.duckdb").query("SELECT count(*) FROM questions")
    message = str(refused.value)
    assert str(path) in message and "warehouse-replica.duckdb" in message and "move it away and rerun" in message
    assert path.stat().st_size == size  # nothing was written to it
    replica = duckdb.connect(str(tmp_path / "warehouse-replica.duckdb"), read_only=True)
    assert replica.execute("SELECT count(*) FROM questions").fetchone()[0] == 400  # the way out it names works


def load_gsm8k_rows(n: int) -> list[dict]:
    return [{"question_id": f"gsm8k:test:{i}", "corpus": "gsm8k", "split": "test", "problem": f"{i} + 1?",
             "answer": str(i + 1)} for i in range(n)]


READER = """
import sys, time, duckdb
path, seconds = sys.argv[1], float(sys.argv[2])
deadline, opens, last = time.monotonic() + seconds, 0, 0
held = duckdb.connect(path, read_only=True)  # kept open across every replacement: its snapshot never moves
held_count = held.execute("SELECT count(*) FROM calls").fetchone()[0]
while time.monotonic() < deadline:
    with duckdb.connect(path, read_only=True) as con:
        calls, workflows, orphans = con.execute(
            "SELECT (SELECT count(*) FROM calls), (SELECT count(*) FROM workflows), (SELECT count(*) FROM calls c "
            "WHERE NOT EXISTS (SELECT 1 FROM workflows w WHERE w.workflow_id = c.workflow_id))").fetchone()
    assert calls == 3 * workflows and orphans == 0, (calls, workflows, orphans)
    assert calls >= last, (calls, last)
    last, opens = calls, opens + 1
    assert held.execute("SELECT count(*) FROM calls").fetchone()[0] == held_count
print(opens, last)
"""


def test_a_reader_of_the_replica_sees_whole_consistent_copies_while_it_is_replaced(tmp_path: Path) -> None:
    """Batches of a workflow and its three calls land while the replica is replaced after each one;
    a reader opening it in a loop must always find 3 calls per workflow, never fewer rows than before."""
    path, replica = tmp_path / "warehouse.duckdb", tmp_path / "warehouse-replica.duckdb"
    store = Warehouse(path, replica_path=replica, replica_interval_s=0)

    def batch(i: int) -> dict[str, list[dict]]:
        workflow = f"w{i}"
        return {
            "workflows": [{"workflow_id": workflow, "run_id": "r", "question_id": "q", "conductor": "c", "parse_code": "ok",
                           "n_steps": 3}],
            "calls": [{"call_id": f"{workflow}-{s}", "run_id": "r", "kind": "step", "question_id": "q", "worker": "x",
                       "sample": 0, "status": "ok", "workflow_id": workflow, "step": s} for s in range(3)],
        }

    store.insert_tables(batch(0))
    store.refresh_replica()
    reader = subprocess.Popen([sys.executable, "-c", READER, str(replica), "4"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    replicas, i = set(), 1
    while reader.poll() is None:
        store.insert_tables(batch(i))  # a batch, then the replica renamed over (interval 0)
        replicas.add((replica.stat().st_ino, replica.stat().st_mtime_ns))
        i += 1
    out, err = reader.communicate()
    assert reader.returncode == 0, err[-3000:]
    opens = int(out.split()[0])
    assert len(replicas) > 10 and opens > 10, (len(replicas), opens)


def test_a_run_lock_left_by_a_dead_process_is_taken_over_saying_whose_it_was(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / ".assets-main.lock"
    lock.write_text("")
    holder = lock.with_name(f"{lock.name}.holder.json")
    holder.write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "started_at": time.time() - 60,
                                  "command": "python -m assets.main"}))
    lines: list[str] = []
    started = time.monotonic()
    with held_lock(lock, "the artifacts folder", log=lines.append) as me:
        assert read_holder(holder) == me
    assert time.monotonic() - started < 2  # no waiting on a dead holder
    assert len(lines) == 1 and f"PID {dead.pid}" in lines[0] and "which is gone; taking it over" in lines[0]
    assert not holder.exists()


HOLD_WAREHOUSE_LOCK = """
import sys, time
from conductor_pipeline.warehouse import Warehouse
store = Warehouse(sys.argv[1])
with store.connect() as con:
    print("HOLDING", flush=True)
    time.sleep(600)
"""


def test_the_warehouse_lock_of_a_killed_writer_is_free_at_once(tmp_path: Path) -> None:
    """A writer SIGKILLed while it holds the warehouse's lock (and DuckDB's) leaves the lock file;
    the next writer gets both at once and finds every row written before."""
    path = tmp_path / "warehouse.duckdb"
    Warehouse(path).insert("questions", load_gsm8k_rows(10))
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    writer = subprocess.Popen([sys.executable, "-c", HOLD_WAREHOUSE_LOCK, str(path)], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=PROJECT_ROOT)
    assert writer.stdout.readline().strip() == "HOLDING"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert Path(f"{path}.lock").exists()  # the lock file stays; the kernel released its lock
    started = time.monotonic()
    store = Warehouse(path, lock_timeout_s=5, busy_timeout_s=5)
    store.insert("questions", load_gsm8k_rows(20))
    assert time.monotonic() - started < 5
    assert store.query("SELECT count(*) AS n FROM questions")["n"][0] == 20


def test_a_pool_file_changed_while_a_run_is_going_is_refused_by_the_next_step(tmp_path: Path) -> None:
    pool_file = tmp_path / "pool.yaml"
    shutil.copy(POOLS_DIR / "replay-mixed6.yaml", pool_file)
    pinned = PoolResource(pool=str(pool_file), pool_sha256=hashlib.sha256(pool_file.read_bytes()).hexdigest())

    @dg.asset
    def first(pool: PoolResource) -> None:
        assert pool.load().name == "replay-mixed6"
        pool_file.write_text(pool_file.read_text().replace("replay-mixed6", "edited-mid-run"))  # the user's edit

    @dg.asset(deps=[first])
    def second(pool: PoolResource) -> None:
        pool.load()

    result = dg.materialize([first, second], resources={"pool": pinned}, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert failure.step_key == "second"
    message = failure.step_failure_data.error.message
    assert str(pool_file) in message and "changed while this run was going" in message and "Rerun" in message
    rebuilt = PoolResource(pool=str(pool_file), pool_sha256=hashlib.sha256(pool_file.read_bytes()).hexdigest())
    assert rebuilt.load().name == "edited-mid-run"  # a rerun (definitions built again) uses the new file


def test_a_truncated_gate_verdict_is_refused_by_name_never_read_as_a_pass(tmp_path: Path) -> None:
    from conductor_pipeline.files import DamagedArtifactError
    from conductor_pipeline.training.gates import evaluate_zero_variance, read_verdict, write_verdict

    path = tmp_path / "gates" / "zero_variance_gate.json"
    write_verdict(path, evaluate_zero_variance([{"frac_zero_std": 0.0}], probe_run_id="p", group_size=4, groups_per_step=2))
    path.write_text(path.read_text()[:40])
    with pytest.raises(DamagedArtifactError, match=str(path)):
        read_verdict(path)
