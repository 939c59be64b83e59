"""VllmLauncherResource with a fake `vllm` executable: servers up inside the block, down after."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from conductor_pipeline.paths import PROJECT_ROOT
from conductor_pipeline.pools.backends.local_server import free_port
from resources.vllm import VllmLauncherResource

FAKE_VLLM = str(PROJECT_ROOT / "tests" / "conductor_pipeline" / "pools" / "backends" / "fake_vllm.py")


def test_launch_serves_vllm_seats_and_stops_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("FAKE_VLLM_MODE", "serve")
    pool_file = tmp_path / "two-local.yaml"
    pool_file.write_text(yaml.safe_dump({
        "name": "two-local",
        "workers": [
            {"name": f"q{i}", "backend": "vllm", "model": f"Qwen/Qwen2.5-{i}B-Instruct", "description": "local",
             "vllm": {"port": free_port(), "gpu_memory_utilization": 0.3}}
            for i in (3, 7)
        ],
    }))
    launcher = VllmLauncherResource(pool=str(pool_file), executable=[sys.executable, FAKE_VLLM],
                                    health_timeout_s=30, health_poll_s=0.1, stop_grace_s=5,
                                    log_dir=str(tmp_path / "logs"))
    with launcher.launch() as served:
        endpoints = [seat.endpoint for seat in served.workers]
        assert [seat.backend for seat in served.workers] == ["openai", "openai"]
        for endpoint in endpoints:
            assert httpx.get(endpoint.removesuffix("/v1") + "/health").status_code == 200
    for endpoint in endpoints:
        with pytest.raises(httpx.TransportError):
            httpx.get(endpoint.removesuffix("/v1") + "/health", timeout=1)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["vllm-q3.log", "vllm-q7.log"]
