"""The vLLM launcher resource: serves a pool's `vllm` seats on this machine's GPU for a run.

Assets that need local models open `launcher.launch()` and get back the pool with each vLLM
seat rewritten as an `openai` seat on its running server; the servers stop when the block
ends, whatever happens inside it. Nothing imports vllm (the `vllm` executable is run), and the
launcher module itself is imported only when a launch happens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from conductor_pipeline.pools.config import PoolConfig, load_pool


class VllmLauncherResource(ConfigurableResource):
    """Starts `vllm serve` for each `vllm` seat of `pool`, one after another, and stops them after."""

    pool: str = Field(description="Pool name (data/pools/<name>.yaml) or path whose `vllm` seats to serve")
    host: str = Field("127.0.0.1", description="Bind address; keep local unless a proxy fronts the servers")
    executable: list[str] = Field(["vllm"], description="Command that runs vLLM's CLI (a venv path on GPU boxes)")
    health_timeout_s: float = Field(900.0, description="Model load + CUDA graph capture can take minutes")
    health_poll_s: float = Field(1.0, description="Seconds between /health checks while a server loads")
    stop_grace_s: float = Field(30.0, description="Seconds after SIGTERM before the process group is killed")
    log_dir: str | None = Field(None, description="Where server logs go (one file per seat); temp files if unset")

    @contextmanager
    def launch(self) -> Iterator[PoolConfig]:
        """Serve the pool's vLLM seats for the duration of the block; yields the rewritten pool."""
        from conductor_pipeline.pools.backends.vllm_server import VllmPool, VllmServer

        pool = load_pool(self.pool)
        log_dir = Path(self.log_dir) if self.log_dir else None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        servers = VllmPool([
            VllmServer(
                seat, host=self.host, executable=self.executable, health_timeout_s=self.health_timeout_s,
                health_poll_s=self.health_poll_s, stop_grace_s=self.stop_grace_s,
                log_path=log_dir / f"vllm-{seat.name}.log" if log_dir else None,
            )
            for seat in pool.workers
            if seat.is_vllm
        ])
        with servers:
            yield servers.served_pool(pool)
