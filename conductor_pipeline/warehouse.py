"""The DuckDB telemetry warehouse: schema, idempotent batch writes, SQL loaded from files.

DuckDB lets one process hold a database file open for writing. Dagster's multiprocess
executor runs steps in separate processes, so every access here is short: take an
inter-process file lock, open the file, do the work, close it. Writers batch rows, so a
probe of thousands of calls holds the lock for milliseconds at a time, and parallel steps
(or two runs at once) queue on the lock instead of failing on DuckDB's. A Dagster
concurrency pool of 1 would also avoid the error, but it would serialize whole steps:
six worker partitions would probe one after another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
from filelock import FileLock

from conductor_pipeline.paths import SQL_DIR

WRITABLE_TABLES = ("questions", "calls", "workflows", "training_steps")


@cache
def load_sql(name: str) -> str:
    """The text of `sql/<name>.sql`. Names, not strings: SQL lives in reviewable files, never in f-strings."""
    path = SQL_DIR / f"{name}.sql"
    if not path.is_file():
        raise FileNotFoundError(f"no SQL file named {name!r} (looked for {path})")
    return path.read_text()


class Warehouse:
    """A DuckDB file plus the lock that serializes access to it across processes."""

    def __init__(self, path: str | Path, *, lock_timeout_s: float = 600.0) -> None:
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self._lock = FileLock(str(self.path) + ".lock", timeout=lock_timeout_s)
        self._schema_applied = False

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection held under the inter-process lock; closed on exit.

        Keep the body short: everyone else who wants the warehouse waits for it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            con = duckdb.connect(str(self.path))
            try:
                con.execute(load_sql("session_settings"))
                if not self._schema_applied:
                    con.execute(load_sql("schema"))
                    self._schema_applied = True
                yield con
            finally:
                con.close()

    def insert(self, table: str, rows: Iterable[Any] | pl.DataFrame | pa.Table) -> int:
        """Write rows (dataclasses, dicts, a polars frame or an arrow table) idempotently.

        Rows whose primary key is already present are skipped (a `calls` row that recorded a
        transient fault is replaced instead); returns how many rows were written.
        """
        if table not in WRITABLE_TABLES:
            raise ValueError(f"unknown warehouse table {table!r}; writable: {WRITABLE_TABLES}")
        batch = _to_arrow(rows)
        if batch.num_rows == 0:
            return 0
        with self.connect() as con:
            con.register("batch", batch)
            con.begin()  # `insert_calls` is a delete plus an insert: all of it lands or none does
            try:
                inserted = con.execute(load_sql(f"insert_{table}")).fetchone()[0]  # the INSERT's row count
                con.commit()
            except BaseException:
                con.rollback()
                raise
            finally:
                con.unregister("batch")
        return int(inserted)

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pl.DataFrame:
        """Run one SELECT and return the result as a polars frame."""
        with self.connect() as con:
            return con.execute(sql, params).pl()

    def query_file(
        self, name: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> pl.DataFrame:
        """Run `sql/<name>.sql` with DuckDB parameters."""
        return self.query(load_sql(name), params)


def sql_row_over_frames(name: str, **relations: pl.DataFrame) -> dict[str, Any]:
    """The one row `sql/<name>.sql` returns over in-memory frames registered under the names its
    contract reads (no warehouse: its own views, e.g. `outcomes`, must not shadow them)."""
    with duckdb.connect() as con:
        for relation, frame in relations.items():
            con.register(relation, frame.to_arrow())
        return con.execute(load_sql(name)).pl().row(0, named=True)


def _to_arrow(rows: Iterable[Any] | pl.DataFrame | pa.Table) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pl.DataFrame):
        return rows.to_arrow()
    dicts = [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in rows]
    return pa.Table.from_pylist(dicts)
