"""Probing writes every (question, worker, sample) once: a killed run resumes with no gap and no duplicate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conductor_pipeline.corpora.loaders import load_gsm8k
from tests.fakes import FaultServer
from tests.fakes.fault_server import FaultRates
from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import PoolConfig, RetryConfig, WorkerSeat, load_pool
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.probing.runner import ProbeProgress, plan_probes, probe_call_id, run_probes
from conductor_pipeline.warehouse import Warehouse
from tests.shared_data import require_shared_data

N_QUESTIONS = 30
SAMPLES = 10


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs", "routerdc_gsm8k_test", "gsm8k_test")


def mixed_pool() -> PoolConfig:
    """Two ZeroEval seats (one sample each) and two RouterDC seats (ten samples each)."""
    zeroeval = load_pool("replay-mixed6").workers
    routerdc = load_pool("replay-routerdc").workers
    return PoolConfig(name="probe-test", workers=[zeroeval[0], zeroeval[5], routerdc[0], routerdc[1]])


def count_rows(warehouse: Warehouse) -> tuple[int, int]:
    """(rows, distinct question x worker x sample triples) of probe calls."""
    frame = warehouse.query(
        "SELECT count(*) AS n, count(DISTINCT (question_id, worker, sample)) AS triples FROM calls WHERE kind = 'probe'"
    )
    return frame["n"][0], frame["triples"][0]


def test_killed_run_resumes_without_duplicates_or_losses(shared: None, tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "w.duckdb")
    pool = mixed_pool()
    questions = load_gsm8k("test")[:N_QUESTIONS]
    total = N_QUESTIONS * len(pool.workers) * SAMPLES
    progress: list[ProbeProgress] = []

    async def probe(run_id: str, cancel_after_batches: int | None = None) -> object:
        workers = build_workers(pool)
        task = asyncio.current_task()

        def on_progress(report: ProbeProgress) -> None:
            progress.append(report)
            if cancel_after_batches is not None and len(progress) >= cancel_after_batches:
                task.cancel()  # the "kill": whatever is in flight is lost

        return await run_probes(
            warehouse, pool, workers, questions, samples=SAMPLES, temperature=0.2, run_id=run_id,
            governor=Governor.from_pool(pool), batch_size=50, on_progress=on_progress,
        )

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(probe("run-1", cancel_after_batches=3))
    written_before, triples_before = count_rows(warehouse)
    assert 0 < written_before < total and written_before == triples_before
    # A write already handed to its thread lands even though the run was killed: fine, the rerun skips it.
    assert progress[-1].done <= written_before and progress[-1].total == total

    summary = asyncio.run(probe("run-2"))
    assert summary.already_done == written_before
    assert summary.issued == summary.written == total - written_before
    assert count_rows(warehouse) == (total, total)
    again = asyncio.run(probe("run-3"))
    assert again.issued == 0 and again.already_done == total

    by_status = warehouse.query(
        "SELECT worker, status, count(*) AS n, count(correct) AS scored FROM calls GROUP BY ALL ORDER BY ALL"
    )
    rows = {(r["worker"], r["status"]): (r["n"], r["scored"]) for r in by_status.iter_rows(named=True)}
    # ZeroEval seats: one real sample per question, the other nine are not_recorded and unscored.
    assert rows[("gpt-4o", "ok")] == (N_QUESTIONS, N_QUESTIONS)
    assert rows[("gpt-4o", "not_recorded")] == (N_QUESTIONS * (SAMPLES - 1), 0)
    # RouterDC seats: ten scored samples per question, verdicts as recorded.
    assert rows[("mistral-7b", "ok")] == (N_QUESTIONS * SAMPLES, N_QUESTIONS * SAMPLES)
    # The graded text of a known response: gpt-4o answers 18 to the first GSM8K question.
    first = warehouse.query(
        "SELECT extracted_answer, correct, tokens_estimated FROM calls WHERE call_id = $id",
        {"id": probe_call_id(pool.name, "gsm8k:test:0", "gpt-4o", 0)},
    )
    assert first.row(0) == ("18", True, True)


def test_only_recorded_skips_what_replay_cannot_answer(shared: None, tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "w.duckdb")
    pool = mixed_pool()
    questions = load_gsm8k("test")[:5]
    summary = asyncio.run(
        run_probes(
            warehouse, pool, build_workers(pool), questions, samples=SAMPLES, temperature=0.2, run_id="r",
            governor=Governor.from_pool(pool), only_recorded=True,
        )
    )
    assert summary.skipped_unrecorded == 2 * 5 * (SAMPLES - 1)
    assert summary.status_counts == {"ok": 2 * 5 + 2 * 5 * SAMPLES}


def test_transient_faults_are_unscored_and_reissued_on_rerun(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "w.duckdb")
    questions = load_gsm8k("test")[:4]
    with FaultServer(faults=FaultRates(server_error=1.0)) as server:
        seat = WorkerSeat(
            name="flaky", backend="openai", model="m", description="d", endpoint=server.base_url, concurrency=4
        )
        pool = PoolConfig(name="faulty", workers=[seat], retry=RetryConfig(max_attempts=1, base_delay_s=0.0))

        def probe() -> object:
            workers = {"flaky": OpenAICompatWorker(seat, pool.retry)}
            return asyncio.run(
                run_probes(
                    warehouse, pool, workers, questions, samples=2, temperature=0.0, run_id="r",
                    governor=Governor.from_pool(pool),
                )
            )

        first = probe()
        assert first.status_counts == {"transient": 8}
        assert warehouse.query("SELECT count(correct) AS scored FROM calls")["scored"][0] == 0
        pending, _, _ = plan_probes(warehouse, pool, {"flaky": None}, questions, samples=2)
        assert len(pending) == 8  # planned again, yet the fault rows stay until their replacements land
        assert warehouse.query("SELECT count(*) AS n FROM calls WHERE status = 'transient'")["n"][0] == 8
        server.configure(faults=FaultRates())
        second = probe()
        assert second.already_done == 0 and second.status_counts == {"ok": 8}
        statuses = warehouse.query("SELECT status, count(*) AS n FROM calls GROUP BY status")
        assert statuses.rows() == [("ok", 8)]
