"""The worker-pool resource: which pool file a run uses, and the workers and governor built from it.

A step that builds workers for `vllm` seats gets their servers started on this machine by the
pool's vLLM launcher (`vllm`); they stay up for the rest of the step and stop when it ends
(`teardown_after_execution`), so the steps that call the pool (probing, evaluation, training
rollouts) need no code of their own for it.

(No `from __future__ import annotations`: Dagster reads the `vllm` annotation as a class to let a
run configure the launcher, `VllmLauncherResource.configure_at_launch()`.)
"""

import os
from collections.abc import Collection, Iterator
from contextlib import ExitStack, contextmanager

import dagster as dg
from pydantic import Field, PrivateAttr

from conductor_pipeline.files import file_sha256
from conductor_pipeline.pools.backends.base import Worker
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.backends.vllm_server import VllmUnavailableError, seats_to_launch
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat, check_api_keys, load_pool, pool_path
from conductor_pipeline.pools.governor import Governor
from resources.vllm import VllmLauncherResource

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
    vllm: dg.ResourceDependency[VllmLauncherResource] = Field(
        default_factory=VllmLauncherResource,
        description="Starts the pool's `vllm` seats (those without an endpoint) for the steps that call them",
    )
    pool_sha256: str | None = Field(
        None,
        description="sha256 of the pool file when the definitions were built; a step refuses a file changed since "
        "(empty: not checked)",
    )

    # Servers this step started, and the seats they serve (as `openai` seats on them).
    _servers: ExitStack = PrivateAttr(default_factory=ExitStack)
    _served: dict[str, WorkerSeat] = PrivateAttr(default_factory=dict)

    def load(self) -> PoolConfig:
        """The pool, as the file was when the definitions were built (`pool_sha256`): every step of a
        run must see one pool, and the code versions that said what to recompute hashed that file."""
        path = pool_path(self.pool)
        if self.pool_sha256 is not None and path.is_file():
            now = file_sha256(path)
            if now != self.pool_sha256:
                raise dg.Failure(
                    f"pool file {path} changed while this run was going (sha256 {self.pool_sha256[:12]} when the run "
                    f"started, {now[:12]} now): its steps must all see one pool. Rerun (`make run`, or reload the "
                    "definitions in the UI) to use the new file; what it changes is recomputed then"
                )
        return load_pool(self.pool)

    def build_workers(self, names: Collection[str] | None = None) -> dict[str, Worker]:
        """One Worker per seat (or per seat in `names`); fails before the first call when any seat's
        API-key variable is unset, or when `vllm` seats must be launched and this machine cannot."""
        pool = self.load()
        check_api_keys(pool)
        return build_workers(self._serve_local_seats(pool, names), names)

    def governor(self) -> Governor:
        """A fresh governor for the pool (one per event loop: build it where it is used)."""
        return Governor.from_pool(self.load())

    def _serve_local_seats(self, pool: PoolConfig, names: Collection[str] | None) -> PoolConfig:
        """`pool` with its `vllm` seats (of `names`) served here: started at first need, kept until the step ends."""
        pending = [seat.name for seat in seats_to_launch(pool, names) if seat.name not in self._served]
        if pending:
            try:
                served = self._servers.enter_context(self.vllm.launch(pool, pending))
            except VllmUnavailableError as exc:  # a setup problem, not a fault: the message is the whole story
                raise dg.Failure(str(exc)) from exc
            self._served.update((seat.name, seat) for seat in served.workers if seat.name in pending)
        return pool.model_copy(update={"workers": [self._served.get(seat.name, seat) for seat in pool.workers]})

    def stop_servers(self) -> None:
        """Stop every vLLM server this resource started."""
        try:
            self._servers.close()
        finally:
            self._served.clear()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.stop_servers()

    @contextmanager
    def serving(self) -> Iterator["PoolResource"]:
        """Outside a Dagster step: the servers `build_workers` starts inside the block stop when it ends."""
        try:
            yield self
        finally:
            self.stop_servers()
