"""Build the Worker that answers for a pool seat, by its backend: the one map from backend to builder.

Backends with heavy or optional dependencies are imported only when a seat needs them, so a
replay-only pool runs without an HTTP client configured and nothing breaks without the `gpu` extra.
To add a backend: a member of `pools.config.Backend`, a Worker class under `pools/backends/`, and
its builder here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from conductor_pipeline.pools.backends.base import Worker
from conductor_pipeline.pools.config import Backend, PoolConfig, WorkerSeat

# (seat, its pool, backend-specific keyword arguments) -> the Worker for the seat.
WorkerBuilder = Callable[..., Worker]


def _openai_compatible(seat: WorkerSeat, pool: PoolConfig, **kwargs: Any) -> Worker:
    # A vllm seat is served by a local `vllm serve` (started by the vLLM resource) and then
    # spoken to over the same OpenAI-compatible API.
    from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker  # noqa: PLC0415

    return OpenAICompatWorker(seat, pool.retry, **kwargs)


def _replay(seat: WorkerSeat, pool: PoolConfig, **kwargs: Any) -> Worker:
    from conductor_pipeline.pools.backends.replay import ReplayWorker  # noqa: PLC0415

    return ReplayWorker(seat, **kwargs)


def _vote(seat: WorkerSeat, pool: PoolConfig, **kwargs: Any) -> Worker:
    # Backend options (e.g. replay's `data_path`) are meant for the seats that call something.
    from conductor_pipeline.pools.backends.vote import VoteWorker  # noqa: PLC0415

    return VoteWorker(seat)


def _no_worker_for_the_conductor(seat: WorkerSeat, pool: PoolConfig, **kwargs: Any) -> Worker:
    raise NotImplementedError(
        f"pool {pool.name!r}, worker {seat.name!r}: a `conductor` seat (the conductor calling itself, "
        "depth-capped recursion) is not a Worker: the orchestrator answers it with its conductor "
        "policy. Build workers for the other seats only (`names=`), or use a pool without one."
    )


WORKER_BUILDERS: Mapping[Backend, WorkerBuilder] = {
    Backend.OPENAI: _openai_compatible,
    Backend.VLLM: _openai_compatible,
    Backend.REPLAY: _replay,
    Backend.CONDUCTOR: _no_worker_for_the_conductor,
    Backend.VOTE: _vote,
}


def build_worker(seat: WorkerSeat, pool: PoolConfig, **kwargs: Any) -> Worker:
    """The Worker for `seat`; `kwargs` go to the backend's constructor (e.g. replay's `data_path`)."""
    builder = WORKER_BUILDERS.get(seat.backend)
    if builder is None:  # only a seat built without validation can get here
        raise ValueError(f"pool {pool.name!r}, worker {seat.name!r}: unknown backend {seat.backend!r}")
    return builder(seat, pool, **kwargs)


def build_workers(pool: PoolConfig, names: Collection[str] | None = None, **kwargs: Any) -> dict[str, Worker]:
    """One Worker per seat of the pool (or per seat in `names`), keyed by worker name."""
    seats = pool.workers if names is None else [pool.seat(name) for name in names]
    return {seat.name: build_worker(seat, pool, **kwargs) for seat in seats}
