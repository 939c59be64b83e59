"""The warehouse resource: dagster-duckdb's resource, with the library's lock and schema."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
from dagster_duckdb import DuckDBResource
from pydantic import Field

from conductor_pipeline.paths import ARTIFACTS_DIR
from conductor_pipeline.warehouse import Warehouse

WAREHOUSE_ENV = "CORYPHAEUS_WAREHOUSE"


def default_warehouse_path() -> str:
    """`$CORYPHAEUS_WAREHOUSE`, else artifacts/warehouse.duckdb; read when the resource is built."""
    return os.environ.get(WAREHOUSE_ENV) or str(ARTIFACTS_DIR / "warehouse.duckdb")


class WarehouseResource(DuckDBResource):
    """The telemetry warehouse (a DuckDB file).

    `get_connection()` keeps dagster-duckdb's contract, but every connection is taken under
    the warehouse's inter-process lock, so parallel steps queue instead of failing on DuckDB's
    single-writer lock. Assets use `get_warehouse()` for the library's batch writes and SQL files.
    """

    database: str = Field(
        default_factory=default_warehouse_path,
        description=f"Path of the DuckDB file (default ${WAREHOUSE_ENV}, else artifacts/warehouse.duckdb)",
    )
    lock_timeout_s: float = Field(600.0, description="How long a step waits for the warehouse lock")

    def get_warehouse(self) -> Warehouse:
        return Warehouse(self.database, lock_timeout_s=self.lock_timeout_s)

    def artifact_dir(self, name: str) -> Path:
        """A folder for an asset's files next to the warehouse, so a test's tmp warehouse keeps them in tmp."""
        path = Path(self.database).parent / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @contextmanager
    def get_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self.get_warehouse().connect() as con:
            yield con
