"""The vLLM launcher resource: serves a pool's `vllm` seats on this machine's GPU for one step.

The pool resource owns one (`PoolResource.vllm`): a step that builds workers for `vllm` seats
gets them served by `launch()`, which yields the pool with each launched seat rewritten as an
`openai` seat on its running server, and the servers stop when the step ends, whatever happens
in it. Seats that name an `endpoint` attach to a server already running and are not launched.
Nothing imports vllm (the `vllm` executable is run).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from conductor_pipeline.pools.backends.vllm_server import (
    VLLM_EXECUTABLE,
    VllmPool,
    VllmServer,
    require_vllm,
    seats_to_launch,
)
from conductor_pipeline.pools.config import PoolConfig


class VllmLauncherResource(ConfigurableResource):
    """Starts `vllm serve` for each `vllm` seat a step needs, one after another, and stops them after."""

    host: str = Field("127.0.0.1", description="Bind address; keep local unless a proxy fronts the servers")
    executable: list[str] = Field(list(VLLM_EXECUTABLE), description="Command that runs vLLM's CLI (a venv path on GPU boxes)")
    require_gpu: bool = Field(True, description="Refuse to launch where no CUDA device is visible (vLLM's CPU builds: off)")
    health_timeout_s: float = Field(900.0, description="Model load + CUDA graph capture can take minutes")
    health_poll_s: float = Field(1.0, description="Seconds between /health checks while a server loads")
    stop_grace_s: float = Field(30.0, description="Seconds after SIGTERM before the process group is killed")
    log_dir: str | None = Field(None, description="Where server logs go (one file per seat); temp files if unset")

    @contextmanager
    def launch(self, pool: PoolConfig, names: Collection[str] | None = None) -> Iterator[PoolConfig]:
        """Serve the `vllm` seats of `names` (default: all) that have no endpoint, for the duration of the
        block; yields `pool` with each of them rewritten as an `openai` seat on its server.

        Fails before starting anything, naming what is missing, when this machine cannot run vLLM.
        """
        seats = seats_to_launch(pool, names)
        if not seats:
            yield pool
            return
        require_vllm(pool, seats, self.executable, require_gpu=self.require_gpu)
        log_dir = Path(self.log_dir) if self.log_dir else None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        servers = VllmPool([
            VllmServer(
                seat, host=self.host, executable=self.executable, health_timeout_s=self.health_timeout_s,
                health_poll_s=self.health_poll_s, stop_grace_s=self.stop_grace_s,
                log_path=log_dir / f"vllm-{seat.name}.log" if log_dir else None,
            )
            for seat in seats
        ])
        with servers:
            yield servers.served_pool(pool)
