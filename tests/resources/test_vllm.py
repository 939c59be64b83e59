"""vLLM seats launched by the registered launcher resource, with a fake `vllm` executable that serves
the OpenAI API on 127.0.0.1: up for the step that calls them, down after; seats naming an endpoint
are attached, never launched; a machine without vLLM or a GPU fails before any server starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import dagster as dg
import httpx
import pytest
import yaml

from assets.definitions import build_definitions
from assets.probing import all_probe_partitions_tags
from benchmarks.soak import synthetic_questions
from tests.fakes import FaultServer
from conductor_pipeline.paths import PROJECT_ROOT
from conductor_pipeline.pools.backends.local_server import free_port
from conductor_pipeline.pools.backends.vllm_server import VllmUnavailableError
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.warehouse import Warehouse
from resources.pool import PoolResource
from resources.vllm import VllmLauncherResource
from resources.warehouse import WAREHOUSE_ENV, WarehouseResource

FAKE_VLLM = str(PROJECT_ROOT / "tests" / "conductor_pipeline" / "pools" / "backends" / "fake_vllm.py")
N_QUESTIONS = 5


@pytest.fixture(autouse=True)
def fake_vllm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake executable imports the project's fault server and answers like `vllm serve`."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("FAKE_VLLM_MODE", "serve")


def vllm_pool_file(path: Path, **extra_seat: object) -> Path:
    path.write_text(yaml.safe_dump({
        "name": path.stem,
        "workers": [
            {"name": f"q{i}", "backend": "vllm", "model": f"Qwen/Qwen2.5-{i}B-Instruct", "description": "local",
             "vllm": {"port": free_port(), "gpu_memory_utilization": 0.3}, **extra_seat}
            for i in (3, 7)
        ],
    }))
    return path


def fake_launcher_config(tmp_path: Path) -> dict:
    return {"executable": [sys.executable, FAKE_VLLM], "require_gpu": False, "health_timeout_s": 60,
            "health_poll_s": 0.1, "stop_grace_s": 5, "log_dir": str(tmp_path / "logs")}


def healthy(endpoint: str) -> bool:
    try:
        return httpx.get(endpoint.removesuffix("/v1") + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_launch_serves_vllm_seats_and_stops_them(tmp_path: Path) -> None:
    pool = load_pool(vllm_pool_file(tmp_path / "two-local.yaml"))
    launcher = VllmLauncherResource(**fake_launcher_config(tmp_path))
    with launcher.launch(pool) as served:
        endpoints = [seat.endpoint for seat in served.workers]
        assert [seat.backend for seat in served.workers] == ["openai", "openai"]
        assert all(e.startswith("http://127.0.0.1:") for e in endpoints) and all(map(healthy, endpoints))
    assert not any(map(healthy, endpoints))
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["vllm-q3.log", "vllm-q7.log"]


def test_probe_calls_on_vllm_seats_served_by_the_registered_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real probe step on a pool of `vllm` seats: the launcher (configured as a run's resource
    config would) starts one fake server per seat, the probe calls them, and they stop with the step."""
    pool_file = vllm_pool_file(tmp_path / "local-vllm.yaml")
    warehouse = tmp_path / "warehouse.duckdb"
    monkeypatch.setenv(WAREHOUSE_ENV, str(warehouse))
    Warehouse(warehouse).insert("questions", synthetic_questions(N_QUESTIONS, prefix="vllm", corpus="synthetic"))
    defs = build_definitions(str(pool_file))
    job = defs.resolve_job_def("probe_job")
    result = job.execute_in_process(
        run_config={
            "resources": {"vllm": {"config": fake_launcher_config(tmp_path)}},
            "ops": {"probe_calls": {"config": {"samples": 2, "corpora": ["synthetic"]}}},
        },
        tags=all_probe_partitions_tags(defs.get_assets_def("probe_calls").partitions_def),
    )
    assert result.success
    calls = Warehouse(warehouse).query("SELECT worker, status, correct FROM calls ORDER BY worker")
    assert calls["worker"].to_list() == ["q3"] * 2 * N_QUESTIONS + ["q7"] * 2 * N_QUESTIONS
    assert set(calls["status"]) == {"ok"} and all(calls["correct"])  # the fake boxes the right answer
    ports = [seat.vllm.port for seat in load_pool(pool_file).workers]
    assert not any(healthy(f"http://127.0.0.1:{port}/v1") for port in ports), "a server outlived its step"
    logged = (tmp_path / "logs" / "vllm-q3.log").read_text()
    assert "FAKE_VLLM_ARGS" in logged and '"host": "127.0.0.1"' in logged and '"gpu_memory_utilization": 0.3' in logged


def test_a_vllm_seat_with_an_endpoint_is_attached_not_launched(tmp_path: Path) -> None:
    with FaultServer() as running:
        pool = PoolResource(
            pool=str(vllm_pool_file(tmp_path / "attached.yaml", endpoint=running.base_url)),
            vllm=VllmLauncherResource(executable=[str(tmp_path / "no-vllm-here")]),  # launching would fail
        )
        with pool.serving():
            workers = pool.build_workers()
            assert {name: w.seat.endpoint for name, w in workers.items()} == {"q3": running.base_url,
                                                                              "q7": running.base_url}


def test_local_qwen_vllm_fails_early_where_vllm_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU machine without the gpu extra: the probe step fails before any call, saying what is
    missing (the executable, a CUDA device) and how to get it."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no `vllm` on it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    defs = build_definitions("local-qwen-vllm")
    result = defs.resolve_job_def("probe_job").execute_in_process(
        tags=all_probe_partitions_tags(defs.get_assets_def("probe_calls").partitions_def), raise_on_error=False,
    )
    [failure] = [event for event in result.all_events if event.is_step_failure]
    message = failure.step_failure_data.error.message
    assert message.startswith("dagster._core.definitions.events.Failure: pool 'local-qwen-vllm'"), message
    for expected in ("qwen2.5-7b", "'vllm' is not found", "no CUDA device", "pip install -e '.[gpu]'", "endpoint"):
        assert expected in message, message
    assert not Warehouse(WarehouseResource().database).query("SELECT * FROM calls").height  # no call was made
    with pytest.raises(dg.Failure) as raised:
        PoolResource(pool="local-qwen-vllm").build_workers()
    assert isinstance(raised.value.__cause__, VllmUnavailableError)
