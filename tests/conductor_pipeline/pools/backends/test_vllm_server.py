"""The vLLM launcher without vLLM: argv building, health wait, early exit, timeout and stop.

A fake `vllm` executable (fake_vllm.py) parses the same command line vLLM would and serves the
fault server's /health and chat completions, so the whole path up to a real call is exercised.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from conductor_pipeline.paths import PROJECT_ROOT
from conductor_pipeline.pools.backends.local_server import free_port
from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker
from conductor_pipeline.pools.backends.vllm_server import VllmPool, VllmServer, VllmServerError, vllm_serve_argv
from conductor_pipeline.pools.config import PoolConfig, RetryConfig, VllmSeatConfig, WorkerSeat
from conductor_pipeline.records import CallStatus
from tests.builders import make_request

FAKE_VLLM = [sys.executable, str(Path(__file__).with_name("fake_vllm.py"))]


def vllm_seat(name: str = "q4", fraction: float = 0.3, port: int = 8100, **extra: object) -> WorkerSeat:
    return WorkerSeat(
        name=name, backend="vllm", model="Qwen/Qwen2.5-3B-Instruct", description="local Qwen",
        vllm=VllmSeatConfig(port=port, gpu_memory_utilization=fraction, max_model_len=4096, dtype="bfloat16",
                            extra_args=["--enforce-eager"]),
        **extra,
    )


def fake_env(mode: str) -> dict[str, str]:
    pythonpath = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "FAKE_VLLM_MODE": mode, "PYTHONPATH": pythonpath}


def test_argv_is_the_real_vllm_command_line() -> None:
    argv = vllm_serve_argv(vllm_seat(), host="127.0.0.1", port=8123)
    assert argv == [
        "vllm", "serve", "Qwen/Qwen2.5-3B-Instruct", "--host", "127.0.0.1", "--port", "8123",
        "--served-model-name", "Qwen/Qwen2.5-3B-Instruct", "--gpu-memory-utilization", "0.3",
        "--max-model-len", "4096", "--dtype", "bfloat16", "--enforce-eager",
    ]


def test_start_wait_call_and_stop(tmp_path: Path) -> None:
    server = VllmServer(vllm_seat(), port=free_port(), executable=FAKE_VLLM, health_timeout_s=30, health_poll_s=0.1,
                        stop_grace_s=5, log_path=tmp_path / "q4.log", env=fake_env("serve"))
    with server:
        assert server.running
        seat = server.openai_seat()
        assert seat.backend == "openai" and seat.endpoint == server.base_url and seat.vllm is None

        async def call() -> CallStatus:
            worker = OpenAICompatWorker(seat, RetryConfig(max_attempts=1))
            try:
                return (await worker.call(make_request())).status
            finally:
                await worker.aclose()

        assert asyncio.run(call()) is CallStatus.OK
    assert not server.running
    assert "FAKE_VLLM_ARGS" in (tmp_path / "q4.log").read_text()  # the fake parsed vLLM's argv


def test_early_exit_raises_with_the_log(tmp_path: Path) -> None:
    server = VllmServer(vllm_seat(), port=free_port(), executable=FAKE_VLLM, health_timeout_s=30, health_poll_s=0.1,
                        log_path=tmp_path / "q4.log", env=fake_env("exit"))
    with pytest.raises(VllmServerError, match=r"exited with code 3(.|\n)*CUDA out of memory"):
        with server:
            pass
    assert not server.running


def test_health_timeout_stops_the_server(tmp_path: Path) -> None:
    server = VllmServer(vllm_seat(), port=free_port(), executable=FAKE_VLLM, health_timeout_s=1.5, health_poll_s=0.1,
                        stop_grace_s=5, log_path=tmp_path / "q4.log", env=fake_env("never"))
    with pytest.raises(VllmServerError, match="not healthy after 2s"):
        with server:
            pass
    assert not server.running


def test_stop_kills_a_group_that_ignores_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "q4.log"
    server = VllmServer(vllm_seat(), port=free_port(), executable=FAKE_VLLM, stop_grace_s=0.5, log_path=log,
                        env=fake_env("stubborn"))
    server.start()
    deadline = time.monotonic() + 20
    while "FAKE_VLLM_CHILD" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    child_pid = int(log.read_text().split("FAKE_VLLM_CHILD")[1].split()[0])
    assert server.stop() == -9  # SIGTERM was ignored; SIGKILL ended it
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the killed child is reaped by init
    status = Path(f"/proc/{child_pid}/status")
    assert not status.exists() or "zombie" in status.read_text()


def test_pool_refuses_memory_fractions_summing_to_one() -> None:
    seats = [vllm_seat("q2", 0.3, 8101), vllm_seat("q4", 0.3, 8102), vllm_seat("q9", 0.4, 8103)]
    with pytest.raises(ValueError, match="sum below 1"):
        VllmPool([VllmServer(seat) for seat in seats])
    with pytest.raises(ValueError, match="distinct ports"):
        VllmPool([VllmServer(vllm_seat("a", 0.2, 8101)), VllmServer(vllm_seat("b", 0.2, 8101))])


def test_pool_serves_every_vllm_seat_and_rewrites_the_pool(tmp_path: Path) -> None:
    other = WorkerSeat(name="hosted", backend="openai", model="gpt-4o", description="hosted",
                       endpoint="https://api.example.com/v1")
    pool = PoolConfig(name="mixed", workers=[vllm_seat("q2", 0.2, free_port()), vllm_seat("q4", 0.3, free_port()),
                                             other])
    servers = VllmPool.from_pool(pool, executable=FAKE_VLLM, health_timeout_s=30, health_poll_s=0.1, stop_grace_s=5,
                                 env=fake_env("serve"))
    assert [s.seat.name for s in servers.servers] == ["q2", "q4"]
    with servers:
        served = servers.served_pool(pool)
        assert all(s.running for s in servers.servers)
        assert [w.backend for w in served.workers] == ["openai", "openai", "openai"]
        assert served.seat("q2").endpoint == servers.servers[0].base_url
        assert served.seat("hosted") == other
    assert not any(s.running for s in servers.servers)
