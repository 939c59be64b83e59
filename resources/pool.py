"""The worker-pool resource: which pool file a run uses, and the workers and governor built from it."""

from __future__ import annotations

import os
from collections.abc import Collection

import dagster as dg
from pydantic import Field

from conductor_pipeline.pools.backends.base import Worker
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import PoolConfig, check_api_keys, load_pool
from conductor_pipeline.pools.governor import Governor

POOL_ENV = "CORYPHAEUS_POOL"
# The embedded default: recorded answers, so the whole graph runs on a laptop CPU at no cost.
DEFAULT_POOL = "replay-mixed6"


def default_pool_name() -> str:
    """`$CORYPHAEUS_POOL`, else the embedded replay default."""
    return os.environ.get(POOL_ENV) or DEFAULT_POOL


class PoolResource(dg.ConfigurableResource):
    """A worker pool (data/pools/<name>.yaml or a path to a pool file)."""

    pool: str = Field(
        default_factory=default_pool_name,
        description=f"Pool name under data/pools/ or a path to a pool YAML (default ${POOL_ENV} or {DEFAULT_POOL})",
    )

    def load(self) -> PoolConfig:
        return load_pool(self.pool)

    def build_workers(self, names: Collection[str] | None = None) -> dict[str, Worker]:
        """One Worker per seat (or per seat in `names`); fails before the first call when any seat's
        API-key variable is unset."""
        pool = self.load()
        check_api_keys(pool)
        return build_workers(pool, names)

    def governor(self) -> Governor:
        """A fresh governor for the pool (one per event loop: build it where it is used)."""
        return Governor.from_pool(self.load())
