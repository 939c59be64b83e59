"""The warehouse resource: dagster-duckdb's resource, with the library's lock and schema, and the
artifacts root every asset writes its files under."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import duckdb
from dagster_duckdb import DuckDBResource
from pydantic import Field, PrivateAttr

from conductor_pipeline.paths import ARTIFACTS_ENV, artifacts_root
from conductor_pipeline.warehouse import (
    DEFAULT_BUSY_TIMEOUT_S,
    DEFAULT_REPLICA_INTERVAL_S,
    Warehouse,
    replica_path_for,
)

WAREHOUSE_ENV = "CORYPHAEUS_WAREHOUSE"
# Writers wait at least this long for a process outside the pipeline to close the file.
MIN_BUSY_TIMEOUT_S = 60.0


def default_warehouse_path() -> str:
    """`$CORYPHAEUS_WAREHOUSE`, else warehouse.duckdb under the artifacts root; read when the resource is built."""
    return os.environ.get(WAREHOUSE_ENV) or str(artifacts_root() / "warehouse.duckdb")


def default_artifacts_root() -> str:
    """`$CORYPHAEUS_ARTIFACTS`, else artifacts/ in the project; read when the resource is built."""
    return str(artifacts_root())


class WarehouseResource(DuckDBResource):
    """The telemetry warehouse (a DuckDB file) and the artifacts root.

    `get_connection()` keeps dagster-duckdb's contract, but every connection is taken under
    the warehouse's inter-process lock, so parallel steps queue instead of failing on DuckDB's
    single-writer lock. Assets use `get_warehouse()` for the library's batch writes and SQL files,
    and `artifact_dir(name)` for their files (tables, plots, manifests, models).
    """

    database: str = Field(
        default_factory=default_warehouse_path,
        description=f"Path of the DuckDB file (default ${WAREHOUSE_ENV}, else <artifacts_root>/warehouse.duckdb)",
    )
    artifacts_root: str = Field(
        default_factory=default_artifacts_root,
        description=f"Folder every asset's files go under (default ${ARTIFACTS_ENV}, else artifacts/); on a "
        "cluster, a volume every pod mounts",
    )
    lock_timeout_s: float = Field(600.0, description="How long a step waits for the warehouse lock")
    busy_timeout_s: float = Field(
        DEFAULT_BUSY_TIMEOUT_S,
        ge=MIN_BUSY_TIMEOUT_S,
        description="How long a writer waits while a process outside the pipeline (a DuckDB shell, a notebook) "
        "holds the file open; it logs the holder's PID meanwhile",
    )
    replica: bool = Field(
        True,
        description="Keep a read-only copy (<warehouse>-replica.duckdb) for live queries that never block a run",
    )
    replica_interval_s: float = Field(
        DEFAULT_REPLICA_INTERVAL_S, ge=0, description="Least seconds between replica refreshes while a step writes"
    )

    # The running step's Dagster log, so "waiting for PID n" shows in the run's events.
    _step_log: Callable[[str], None] | None = PrivateAttr(None)

    @property
    def replica_path(self) -> Path | None:
        return replica_path_for(self.database) if self.replica else None

    def get_warehouse(self) -> Warehouse:
        return Warehouse(
            self.database,
            lock_timeout_s=self.lock_timeout_s,
            busy_timeout_s=self.busy_timeout_s,
            replica_path=self.replica_path,
            replica_interval_s=self.replica_interval_s,
            on_wait=self._step_log,
        )

    def artifact_dir(self, name: str) -> Path:
        """A folder for an asset's files under the artifacts root (created if missing)."""
        path = Path(self.artifacts_root) / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @contextmanager
    def get_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self.get_warehouse().connect() as con:
            yield con

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        if context.log is not None:
            self._step_log = context.log.warning

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """A step's last write batches may have come too close together to copy each: copy them now."""
        if self.replica and Path(self.database).is_file():
            self.get_warehouse().refresh_replica()
