"""The backend registry: every backend a pool file may name has a builder, and each builds its Worker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from conductor_pipeline.paths import POOLS_DIR
from conductor_pipeline.pools.backends import RecordedWorker, Worker
from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker
from conductor_pipeline.pools.backends.registry import WORKER_BUILDERS, build_worker, build_workers
from conductor_pipeline.pools.backends.replay import ROUTERDC_SAMPLES, ReplayWorker
from conductor_pipeline.pools.config import Backend, PoolConfig, PoolConfigError, WorkerSeat, load_pool
from tests.builders import RecordingWorker

# Port 9 (discard) on 127.0.0.1: nothing listens, and no test here makes a call.
UNUSED_ENDPOINT = "http://127.0.0.1:9/v1"


def routerdc_file(tmp_path: Path, model: str = "m") -> Path:
    """A two-question RouterDC-shaped file: the replay worker needs no shared data."""
    path = tmp_path / "routerdc.json"
    path.write_text(json.dumps([{"scores": {model: 0.3}}, {"scores": {model: 1.0}}]))
    return path


def replay_seat(name: str = "r") -> WorkerSeat:
    return WorkerSeat(name=name, backend="replay", replay_source="routerdc", model="m", description="recorded")


def test_every_backend_has_a_builder() -> None:
    assert set(WORKER_BUILDERS) == set(Backend)


def test_every_shipped_pool_names_registered_backends_only() -> None:
    for path in sorted(POOLS_DIR.glob("*.yaml")):
        pool = load_pool(path)
        assert {seat.backend for seat in pool.workers} <= set(WORKER_BUILDERS), path


def test_an_unknown_backend_is_refused_naming_file_worker_field_and_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(f"name: p\nworkers:\n  - name: q4\n    backend: anthropic-direct\n    model: m\n"
                    f"    description: d\n    endpoint: {UNUSED_ENDPOINT}\n")
    with pytest.raises(PoolConfigError) as caught:
        load_pool(path)
    message = str(caught.value)
    assert str(path) in message and "workers[0] (worker 'q4').backend" in message
    assert all(f"'{backend}'" in message for backend in Backend), message


def test_a_seat_that_skipped_validation_still_gets_a_named_error() -> None:
    seat = WorkerSeat.model_construct(name="odd", backend="carrier-pigeon", model="m", description="d")
    with pytest.raises(ValueError, match="pool 'p', worker 'odd': unknown backend 'carrier-pigeon'"):
        build_worker(seat, PoolConfig(name="p", workers=[replay_seat()]))


def test_each_backend_builds_its_worker(tmp_path: Path) -> None:
    hosted = WorkerSeat(name="h", backend="openai", model="m", description="d", endpoint=UNUSED_ENDPOINT)
    local = WorkerSeat(name="v", backend="vllm", model="m", description="d", endpoint=UNUSED_ENDPOINT)
    pool = PoolConfig(name="p", workers=[hosted, local, replay_seat()])
    workers = build_workers(pool, ["h", "v"]) | build_workers(pool, ["r"], data_path=routerdc_file(tmp_path))
    assert isinstance(workers["h"], OpenAICompatWorker) and isinstance(workers["v"], OpenAICompatWorker)
    assert isinstance(workers["r"], ReplayWorker)
    for worker in workers.values():
        asyncio.run(worker.aclose())


def test_a_vllm_seat_without_a_server_says_where_its_endpoint_comes_from() -> None:
    seat = WorkerSeat(name="v", backend="vllm", model="m", description="d")
    with pytest.raises(ValueError, match="worker 'v' has no endpoint.*VllmLauncherResource.launch"):
        build_worker(seat, PoolConfig(name="p", workers=[seat]))


def test_the_conductor_seat_is_answered_by_no_worker() -> None:
    seat = WorkerSeat(name="self", backend="conductor", model="c", description="the conductor itself")
    with pytest.raises(NotImplementedError, match="pool 'p', worker 'self'.*conductor policy"):
        build_worker(seat, PoolConfig(name="p", workers=[seat]))


def test_replay_is_a_recorded_worker_and_live_workers_are_not(tmp_path: Path) -> None:
    replay = ReplayWorker(replay_seat(), data_path=routerdc_file(tmp_path))
    assert isinstance(replay, Worker) and isinstance(replay, RecordedWorker)
    assert replay.samples_recorded == ROUTERDC_SAMPLES
    assert replay.question_ids == frozenset({"gsm8k:test:0", "gsm8k:test:1"})
    assert replay.covers("gsm8k:test:1", ROUTERDC_SAMPLES - 1) and not replay.covers("gsm8k:test:2")
    hosted = OpenAICompatWorker(
        WorkerSeat(name="h", backend="openai", model="m", description="d", endpoint=UNUSED_ENDPOINT),
        PoolConfig(name="p", workers=[replay_seat()]).retry,
    )
    for live in (hosted, RecordingWorker("scripted")):
        assert isinstance(live, Worker) and not isinstance(live, RecordedWorker)
    asyncio.run(hosted.aclose())
