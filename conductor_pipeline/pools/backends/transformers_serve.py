"""Serve a local model directory with `transformers serve` on 127.0.0.1 (CPU profile and tests).

`transformers serve` (the `serving` extra) is an OpenAI-compatible server, so a seat on it is an
ordinary `openai` seat: the pipeline's real client code runs against a real model without a GPU
or a hub. The server is pinned to one model directory and then answers only requests whose
`model` is that directory's path, so `bind_seat` rewrites a pool seat's endpoint and model id.
Hub access is switched off in the server's environment: it must load from the directory or fail.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from conductor_pipeline.pools.backends.local_server import DEFAULT_STOP_GRACE_S, LocalServerProcess, free_port
from conductor_pipeline.pools.config import Backend, WorkerSeat

# Importing torch + transformers and loading even a tiny model takes 10-30 s on a busy 2-core box.
DEFAULT_STARTUP_TIMEOUT_S = 180.0
# Poll often: the tiny models load in seconds and tests wait on this.
STARTUP_POLL_S = 0.25
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def transformers_executable() -> list[str]:
    """The `transformers` CLI of this interpreter's environment (the venv's, not whatever is on PATH)."""
    script = Path(sys.executable).with_name("transformers")
    return [str(script)] if script.exists() else ["transformers"]


def transformers_serve_argv(
    model_dir: Path, *, host: str, port: int, device: str = "cpu", extra_args: Sequence[str] = ()
) -> list[str]:
    return [
        *transformers_executable(), "serve", str(model_dir),
        "--host", host, "--port", str(port), "--device", device, "--log-level", "warning",
        *extra_args,
    ]


class TransformersServer(LocalServerProcess):
    """`transformers serve <model_dir>` on a free local port, ready when `/health` says so."""

    def __init__(
        self,
        model_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        device: str = "cpu",
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.model_dir = Path(model_dir).resolve()
        if not (self.model_dir / "config.json").exists():
            raise FileNotFoundError(f"{self.model_dir} is not a saved model directory (no config.json)")
        port = port if port is not None else free_port(host)
        super().__init__(
            transformers_serve_argv(self.model_dir, host=host, port=port, device=device, extra_args=extra_args),
            name=f"transformers-serve-{self.model_dir.name}", host=host, port=port,
            health_timeout_s=startup_timeout_s, health_poll_s=STARTUP_POLL_S, stop_grace_s=stop_grace_s,
            log_path=log_path, env={**(os.environ if env is None else env), **OFFLINE_ENV},
        )

    @property
    def model_id(self) -> str:
        """The `model` every request must name: the pinned server accepts only its directory."""
        return str(self.model_dir)

    def bind_seat(self, seat: WorkerSeat) -> WorkerSeat:
        """`seat` pointed at this server (endpoint and model id), as an `openai` seat."""
        return seat.model_copy(update={"backend": Backend.OPENAI, "endpoint": self.base_url, "model": self.model_id})
