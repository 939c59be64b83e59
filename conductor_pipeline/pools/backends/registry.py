"""Build the Worker that answers for a pool seat, by its backend.

Backends with heavy or optional dependencies are imported only when a seat needs them, so a
replay-only pool runs without an HTTP client configured and nothing breaks without the `gpu` extra.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from conductor_pipeline.pools.backends.base import Worker
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat


def build_worker(seat: WorkerSeat, pool: PoolConfig, **kwargs: Any) -> Worker:
    """The Worker for `seat`; `kwargs` go to the backend's constructor (e.g. replay's `data_path`)."""
    if seat.backend in ("openai", "vllm"):
        # A vllm seat is served by a local `vllm serve` (started by the vLLM resource) and then
        # spoken to over the same OpenAI-compatible API.
        from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker  # noqa: PLC0415

        return OpenAICompatWorker(seat, pool.retry, **kwargs)
    if seat.backend == "replay":
        from conductor_pipeline.pools.backends.replay import ReplayWorker  # noqa: PLC0415

        return ReplayWorker(seat, **kwargs)
    if seat.backend == "conductor":
        raise NotImplementedError(
            f"pool {pool.name!r}, worker {seat.name!r}: a `conductor` seat (the conductor calling itself, "
            "depth-capped recursion) is not a Worker: the orchestrator answers it with its conductor "
            "policy. Build workers for the other seats only (`names=`), or use a pool without one."
        )
    raise ValueError(f"pool {pool.name!r}, worker {seat.name!r}: unknown backend {seat.backend!r}")


def build_workers(pool: PoolConfig, names: Collection[str] | None = None, **kwargs: Any) -> dict[str, Worker]:
    """One Worker per seat of the pool (or per seat in `names`), keyed by worker name."""
    seats = pool.workers if names is None else [pool.seat(name) for name in names]
    return {seat.name: build_worker(seat, pool, **kwargs) for seat in seats}
