"""Two materializations of different assets at the same time against one warehouse: both succeed.

Two `dagster asset materialize` processes share one Dagster instance and one DuckDB warehouse:
`questions` (loads every corpus, ~21k rows, from the shared data) and `probe_calls` (a pool of
`openai` seats on the fault server, writing calls in small batches while the other run writes
questions). DuckDB allows one writing process per file; the warehouse's file lock must make the
runs queue, not fail. Takes about a minute and a half on two shared cores.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import dagster as dg
import pytest

from benchmarks.soak import synthetic_questions, write_pool_file
from tests.fakes import FaultServer
from conductor_pipeline.probing.runner import probe_call_id
from conductor_pipeline.warehouse import Warehouse
from tests.reliability.dagster_cli import CLI_TIMEOUT_S, dagster_env, start_materialize
from tests.shared_data import require_shared_data

SEATS = ("w0", "w1")
N_QUESTIONS = 100
SAMPLES = 2
# 400 calls, 8 in flight, 0.8 s each: a ~40 s probe step. `questions` starts once the probe is
# writing and needs a few seconds of CLI start-up plus ~1-5 s of work, so it runs inside the probe;
# the margin covers a CLI start-up of 20 s and more while other test workers share the cores.
LATENCY_S = 0.8
PROBE_WRITING_TIMEOUT_S = 120.0


def step_spans(instance: dg.DagsterInstance) -> dict[str, tuple[float, float]]:
    spans: dict[str, list[float]] = {}
    for run in instance.get_runs():
        for record in instance.all_logs(run.run_id):
            event = record.dagster_event
            if event and event.event_type_value in ("STEP_START", "STEP_SUCCESS"):
                spans.setdefault(event.step_key, []).append(record.timestamp)
    return {step: (min(times), max(times)) for step, times in spans.items()}


def wait_for_probe_rows(store: Warehouse, probe: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + PROBE_WRITING_TIMEOUT_S
    while store.query("SELECT count(*) AS n FROM calls WHERE pool = 'concurrent-pool'")["n"][0] == 0:
        assert probe.poll() is None, "the probe run ended before writing a row"
        assert time.monotonic() < deadline, "the probe run wrote nothing in time"
        time.sleep(0.2)


# Slow (two CLI runs and a ~40 s probe): writers queueing on the warehouse's file lock are also covered
# by tests/assets/test_parallel_writers.py and tests/conductor_pipeline/test_warehouse.py.
@pytest.mark.slow
def test_questions_and_probe_calls_materialize_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train")
    warehouse_path = tmp_path / "warehouse.duckdb"
    questions = synthetic_questions(N_QUESTIONS, prefix="concurrent", corpus="synthetic")
    Warehouse(warehouse_path).insert("questions", questions)
    with FaultServer(latency_s=LATENCY_S) as server:
        pool = write_pool_file(tmp_path / "pool.yaml", server.base_url, name="concurrent-pool", seats=SEATS,
                               concurrency=4)
        env = dagster_env(tmp_path / "dagster_home", warehouse_path, pool)
        probe_config = {"ops": {"probe_calls": {"config": {
            "samples": SAMPLES, "corpora": ["synthetic"], "batch_size": 10}}}}
        processes = {
            "probe_calls": start_materialize("probe_calls", env, partition_range=f"{SEATS[0]}...{SEATS[-1]}",
                                             run_config=probe_config, log_path=tmp_path / "probe.log"),
        }
        # Start `questions` once the probe is writing: started together, the short `questions` step
        # could finish before the probe step began (it did once), and nothing would have overlapped.
        wait_for_probe_rows(Warehouse(warehouse_path), processes["probe_calls"])
        processes["questions"] = start_materialize("questions", env, log_path=tmp_path / "questions.log")
        codes = {name: process.wait(timeout=CLI_TIMEOUT_S) for name, process in processes.items()}
    for name, code in codes.items():
        log = (tmp_path / ("probe.log" if name == "probe_calls" else "questions.log")).read_text(errors="replace")
        assert code == 0, f"{name} failed:\n{log[-4000:]}"

    with dg.DagsterInstance.from_config(str(tmp_path / "dagster_home")) as instance:
        runs = instance.get_runs()
        assert len(runs) == 2 and all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
        spans = step_spans(instance)
    (probe_start, probe_end), (questions_start, questions_end) = spans["probe_calls"], spans["questions"]
    assert probe_start < questions_end and questions_start < probe_end, f"the steps did not overlap: {spans}"

    store = Warehouse(warehouse_path)
    counts = store.query("SELECT corpus, count(*) AS n FROM questions GROUP BY corpus ORDER BY corpus")
    by_corpus = dict(zip(counts["corpus"].to_list(), counts["n"].to_list(), strict=True))
    assert by_corpus["synthetic"] == N_QUESTIONS and by_corpus["math"] == 12_500
    assert by_corpus["gsm8k"] == 1_319 + 7_473
    written = set(store.query("SELECT call_id FROM calls WHERE pool = 'concurrent-pool'")["call_id"].to_list())
    expected = {probe_call_id("concurrent-pool", q.question_id, seat, s)
                for q in questions for seat in SEATS for s in range(SAMPLES)}
    assert written == expected
