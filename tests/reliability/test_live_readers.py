"""A probe run while people look at the warehouse: it waits for a shell holding the file, and a
reader of the replica held open across the whole run never blocks it.

Real processes throughout: `dagster asset materialize` probing a pool of `openai` seats on the
fault server into a DuckDB file; one reader process holds that file open read-only until the run
says it is waiting for it (as a DuckDB shell would), another holds the replica open from before
the run to after it.
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb

from benchmarks.soak import synthetic_questions, write_pool_file
from tests.fakes import FaultServer
from conductor_pipeline.probing.runner import probe_call_id
from conductor_pipeline.warehouse import Warehouse, replica_path_for
from tests.builders import start_reader, stop_reader
from tests.reliability.dagster_cli import CLI_TIMEOUT_S, dagster_env, start_materialize

SEATS = ("w0", "w1")
N_QUESTIONS = 40
SAMPLES = 2


def test_a_probe_run_waits_for_a_shell_and_never_for_a_replica_reader(tmp_path: Path) -> None:
    warehouse_path = tmp_path / "warehouse.duckdb"
    replica = replica_path_for(warehouse_path)
    questions = synthetic_questions(N_QUESTIONS, prefix="live", corpus="synthetic")
    Warehouse(warehouse_path, replica_path=replica).insert("questions", questions)
    with FaultServer(latency_s=0.05) as server:
        pool = write_pool_file(tmp_path / "pool.yaml", server.base_url, name="live-pool", seats=SEATS, concurrency=4)
        env = dagster_env(tmp_path / "dagster_home", warehouse_path, pool)
        replica_reader, _ = start_reader(replica, hold_s=CLI_TIMEOUT_S)
        shell, _ = start_reader(warehouse_path, hold_s=CLI_TIMEOUT_S)
        probe = start_materialize(
            "probe_calls", env, partition_range=f"{SEATS[0]}...{SEATS[-1]}", log_path=tmp_path / "probe.log",
            run_config={"ops": {"probe_calls": {"config": {"samples": SAMPLES, "corpora": ["synthetic"],
                                                           "batch_size": 10}}}},
        )
        waiting_line = f"is held by PID {shell.pid} ("
        deadline = time.monotonic() + CLI_TIMEOUT_S
        while waiting_line not in (tmp_path / "probe.log").read_text(errors="replace"):
            assert probe.poll() is None, "the run ended without saying which process it waited for"
            assert time.monotonic() < deadline, "the run never said which process it waited for"
            time.sleep(0.5)
        stop_reader(shell)  # the shell is closed once the run has said it waits for it
        code = probe.wait(timeout=CLI_TIMEOUT_S)
        assert replica_reader.poll() is None, "the replica reader did not stay open across the run"
        replica_rows_held = stop_reader(replica_reader)
    log = (tmp_path / "probe.log").read_text(errors="replace")
    assert code == 0, log[-4000:]
    assert replica_rows_held == 0  # the snapshot it opened, before any call was written

    expected = {probe_call_id("live-pool", q.question_id, seat, s) for q in questions for seat in SEATS
                for s in range(SAMPLES)}
    written = Warehouse(warehouse_path).query("SELECT call_id FROM calls WHERE pool = 'live-pool'")
    assert set(written["call_id"].to_list()) == expected
    with duckdb.connect(str(replica), read_only=True) as con:  # caught up once the step ended
        assert con.execute("SELECT count(*) FROM calls WHERE pool = 'live-pool'").fetchone()[0] == len(expected)
