"""The DuckDB telemetry warehouse: schema, idempotent batch writes, SQL loaded from files.

DuckDB lets one process hold a database file open for writing. Dagster's multiprocess
executor runs steps in separate processes, so every access here is short: take an
inter-process file lock, open the file, do the work, close it. Writers batch rows, so a
probe of thousands of calls holds the lock for milliseconds at a time, and parallel steps
(or two runs at once) queue on the lock instead of failing on DuckDB's. A Dagster
concurrency pool of 1 would also avoid the error, but it would serialize whole steps:
six worker partitions would probe one after another.

Processes outside the pipeline (a DuckDB shell, a notebook) know nothing of that file lock:
one that holds the file open, even read-only, makes DuckDB refuse every writer. A writer
then waits for it (bounded, logging which process holds the file) instead of failing. So
that looking at live telemetry never blocks a run, the warehouse can keep a read-only
replica: a copy of the file taken under the lock after write batches, renamed into place,
so a reader holding the old copy open keeps a consistent snapshot and the writer never
waits for it. A file copy costs tens of milliseconds per hundred MB from the page cache,
where DuckDB's own `COPY FROM DATABASE` rewrites every table.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
from filelock import FileLock

from conductor_pipeline.files import is_disk_full, temporary_sibling, write_failure
from conductor_pipeline.paths import SQL_DIR

logger = logging.getLogger(__name__)

WRITABLE_TABLES = ("questions", "calls", "workflows", "training_steps")
# How long a writer waits for another process to let go of the DuckDB file. An analyst's shell
# left open is the usual holder; a minute or more gives them time to notice the log line.
DEFAULT_BUSY_TIMEOUT_S = 300.0
# Between attempts to open a file another process holds, and between log lines about it.
BUSY_POLL_S = 0.5
BUSY_LOG_EVERY_S = 15.0
# A replica is refreshed after a write batch unless it is younger than this (a step's last batch
# is copied when the step ends: `refresh_replica`). Each refresh folds the write-ahead log into the
# file first, which is most of what a write costs (`WAL_FOLD_BYTES`): half a second on a 120 MB
# warehouse, so a live view half a minute old is what a run can afford on two cores.
DEFAULT_REPLICA_INTERVAL_S = 30.0
# Closing a connection leaves its writes in the write-ahead log until the log holds this much.
# Folding it in (DuckDB's checkpoint) rewrites every row group the writes touched: about 0.2 s for
# an eval batch on a 120 MB warehouse, against 0.07 s for the rest of the write; each open replays
# what the log holds, about 13 ms a MiB.
WAL_FOLD_BYTES = 2 * 1024 * 1024
# DuckDB's message when another process holds the file: it names the program and PID.
_LOCK_HOLDER = re.compile(
    r"Conflicting lock is held in (?P<program>.+?) \(PID (?P<pid>\d+)\)(?: by user (?P<user>[^\s.]+))?"
)


class WarehouseBusyError(RuntimeError):
    """Another process kept the warehouse file open for longer than the writer would wait."""


class WarehouseDamagedError(RuntimeError):
    """The warehouse file is truncated or corrupt: DuckDB cannot read it. Nothing is written to it."""


# DuckDB's messages for a file it cannot read as a database: cut short, or not DuckDB's at all.
_DAMAGE = re.compile(r"Could not read enough bytes|not a valid DuckDB database file|Corrupt database file|checksum")


def damage_error(path: Path, replica: Path | None, exc: BaseException) -> WarehouseDamagedError:
    """The error for a warehouse DuckDB cannot read: the file, and the two ways out."""
    if replica is not None and replica.is_file():
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(replica.stat().st_mtime))
        restore = (f"copy its read-only replica {replica} (taken {taken}; rows written after that are lost) over "
                   f"it with no run going, or ")
    else:
        restore = ""
    return WarehouseDamagedError(
        f"warehouse {path} is damaged (truncated or corrupt: {exc}). Nothing was written to it. To go on, "
        f"{restore}move it away and rerun `make run`, which recomputes everything into a new warehouse"
    )


def lock_holder(message: str) -> str | None:
    """The process DuckDB names in a conflicting-lock message, e.g. `PID 123 (/usr/bin/duckdb)`;
    None for any other error."""
    match = _LOCK_HOLDER.search(message)
    if match is None:
        return None
    user = f", user {match['user']}" if match["user"] else ""
    return f"PID {match['pid']} ({match['program']}{user})"


def replica_path_for(path: str | Path) -> Path:
    """Where the read-only replica of warehouse `path` lives: `warehouse.duckdb` -> `warehouse-replica.duckdb`."""
    path = Path(path)
    return path.with_name(f"{path.stem}-replica{path.suffix}")


@cache
def load_sql(name: str) -> str:
    """The text of `sql/<name>.sql`. Names, not strings: SQL lives in reviewable files, never in f-strings."""
    path = SQL_DIR / f"{name}.sql"
    if not path.is_file():
        raise FileNotFoundError(f"no SQL file named {name!r} (looked for {path})")
    return path.read_text()


class Warehouse:
    """A DuckDB file plus the lock that serializes access to it across processes.

    `busy_timeout_s`: how long to wait when a process outside the pipeline holds the file.
    `replica_path`: where to keep a read-only copy for live queries (None: no replica);
    `replica_interval_s`: the least time between two refreshes after write batches.
    `on_wait`: where the "waiting for PID n" lines go (default: this module's logger).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        lock_timeout_s: float = 600.0,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        replica_path: str | Path | None = None,
        replica_interval_s: float = DEFAULT_REPLICA_INTERVAL_S,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.wal_path = Path(f"{self.path}.wal")  # DuckDB's write-ahead log beside the file
        self.lock_timeout_s = lock_timeout_s
        self.busy_timeout_s = busy_timeout_s
        self.replica_path = Path(replica_path) if replica_path is not None else None
        self.replica_interval_s = replica_interval_s
        self._on_wait = on_wait or logger.warning
        self._lock = FileLock(str(self.path) + ".lock", timeout=lock_timeout_s)
        self._schema_applied = False

    def _open(self) -> duckdb.DuckDBPyConnection:
        """Open the file for writing; while another process holds it, wait (bounded) and say who."""
        deadline = time.monotonic() + self.busy_timeout_s
        next_log = 0.0
        while True:
            try:
                return duckdb.connect(str(self.path))
            except duckdb.IOException as exc:
                holder = lock_holder(str(exc))
                if holder is None and _DAMAGE.search(str(exc)):
                    raise damage_error(self.path, self.replica_path, exc) from exc
                if holder is None:
                    raise
                now = time.monotonic()
                if now >= deadline:
                    where = f"the read-only replica {self.replica_path}" if self.replica_path else "a copy of the file"
                    raise WarehouseBusyError(
                        f"warehouse {self.path} was held by {holder} for over {self.busy_timeout_s:.0f}s; "
                        f"close that connection (live queries belong on {where})"
                    ) from exc
                if now >= next_log:
                    self._on_wait(
                        f"warehouse {self.path} is held by {holder}; waiting up to "
                        f"{deadline - now:.0f}s more for it to close"
                    )
                    next_log = now + BUSY_LOG_EVERY_S
                time.sleep(BUSY_POLL_S)

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection held under the inter-process lock; closed on exit.

        Keep the body short: everyone else who wants the warehouse waits for it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            con = self._open()
            applies_schema = not self._schema_applied
            try:
                con.execute(load_sql("session_settings"))
                if applies_schema:
                    con.execute(load_sql("schema"))
                    self._schema_applied = True
                yield con
            except duckdb.Error as exc:  # a truncation can surface only when a damaged block is read
                if _DAMAGE.search(str(exc)):
                    raise damage_error(self.path, self.replica_path, exc) from exc
                if is_disk_full(exc):
                    raise self._disk_full(exc) from exc
                raise
            finally:
                self._close(con, fold=applies_schema)

    def _close(self, con: duckdb.DuckDBPyConnection, *, fold: bool) -> None:
        """Close, leaving the write-ahead log unfolded while it is under `WAL_FOLD_BYTES` (the next
        open replays it; the replica is always copied from a folded file). The log is always folded
        after the schema was applied: DuckDB 1.5.6 fails to replay a log that creates the tables
        (`ALTER TABLE ... ADD COLUMN ... DEFAULT`) and then writes rows. A connection that cannot
        take the setting (its transaction failed) folds the log as it closes."""
        wal = self.wal_path
        try:
            if not fold and (not wal.is_file() or wal.stat().st_size < WAL_FOLD_BYTES):
                con.execute("PRAGMA disable_checkpoint_on_shutdown")
        except duckdb.Error:
            logger.debug("closing %s after a failed transaction: its log is folded in now", self.path)
        finally:
            con.close()

    def execute_files(self, names: Sequence[str], params: Mapping[str, Any]) -> list[tuple]:
        """Run `sql/<name>.sql` for each name, in order, in one transaction (all land or none
        does); returns the rows the last one returns (a DELETE's RETURNING rows, or its count)."""
        with self._lock:
            with self.connect() as con:
                con.begin()
                try:
                    rows: list[tuple] = []
                    for name in names:
                        rows = con.execute(load_sql(name), params).fetchall()
                    con.commit()
                except BaseException as exc:
                    _roll_back(con)
                    if is_disk_full(exc):
                        raise self._disk_full(exc) from exc
                    raise
            self._refresh_replica(min_age_s=self.replica_interval_s)
        return rows

    def insert(self, table: str, rows: Iterable[Any] | pl.DataFrame | pa.Table) -> int:
        """Write rows (dataclasses, dicts, a polars frame or an arrow table) idempotently.

        Rows whose primary key is already present are skipped (a `calls` row that recorded a
        transient fault is replaced instead); returns how many rows were written.
        """
        return self.insert_tables({table: rows})[table]

    def insert_tables(self, batches: Mapping[str, Iterable[Any] | pl.DataFrame | pa.Table]) -> dict[str, int]:
        """`insert` into several tables, in the mapping's order, in one transaction: all of it lands
        or none does (a workflow's calls with the workflow), and the file is opened, and its changes
        checkpointed, once. Returns how many rows each table got."""
        unknown = [table for table in batches if table not in WRITABLE_TABLES]
        if unknown:
            raise ValueError(f"unknown warehouse table {unknown[0]!r}; writable: {WRITABLE_TABLES}")
        arrow = {table: _to_arrow(rows) for table, rows in batches.items()}
        inserted = dict.fromkeys(batches, 0)
        if not any(batch.num_rows for batch in arrow.values()):
            return inserted
        with self._lock:  # reentrant: the replica is copied before another writer gets in
            with self.connect() as con:
                con.begin()  # `insert_calls` is a delete plus an insert: all of it lands or none does
                try:
                    for table, batch in arrow.items():
                        if batch.num_rows == 0:
                            continue
                        con.register("batch", batch)
                        try:
                            inserted[table] = int(con.execute(load_sql(f"insert_{table}")).fetchone()[0])
                        finally:
                            con.unregister("batch")
                    con.commit()
                except BaseException as exc:
                    _roll_back(con)
                    if is_disk_full(exc):
                        raise self._disk_full(exc) from exc
                    raise
            self._refresh_replica(min_age_s=self.replica_interval_s)
        return inserted

    def _disk_full(self, exc: BaseException) -> OSError:
        """A write that failed on a full disk: the file, that nothing of it landed, and the way on."""
        return write_failure(self.path, "to the warehouse", exc, "its transaction was rolled back: none of its rows landed")

    def refresh_replica(self) -> bool:
        """Copy the warehouse to its replica if the replica is older than the file; True if copied.

        Called after write batches (throttled) and when a step ends, so the replica is at most one
        interval behind while a step writes and up to date once it is done.
        """
        with self._lock:
            return self._refresh_replica(min_age_s=0.0)

    def _refresh_replica(self, *, min_age_s: float) -> bool:
        """Under the lock: copy the closed file beside the replica, then rename it over the replica."""
        replica = self.replica_path
        if replica is None or not self.path.is_file():
            return False
        wal = self.wal_path
        source_mtime = max(path.stat().st_mtime_ns for path in (self.path, wal) if path.is_file())
        if replica.is_file():
            replica_mtime = replica.stat().st_mtime_ns
            if replica_mtime > source_mtime or time.time_ns() - replica_mtime < min_age_s * 1e9:
                return False
        if wal.exists():  # writes not folded in yet (`_close`), or left by a crash: fold them in first
            self._open().close()
        replica.parent.mkdir(parents=True, exist_ok=True)
        staging = temporary_sibling(replica)
        try:
            shutil.copyfile(self.path, staging)
            staging.replace(replica)
        except OSError as exc:
            staging.unlink(missing_ok=True)
            raise write_failure(replica, "the warehouse replica", exc) from exc
        return True

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pl.DataFrame:
        """Run one SELECT and return the result as a polars frame."""
        with self.connect() as con:
            return con.execute(sql, params).pl()

    def query_file(
        self, name: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> pl.DataFrame:
        """Run `sql/<name>.sql` with DuckDB parameters."""
        return self.query(load_sql(name), params)


def _roll_back(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back a failed transaction (after a fatal write error DuckDB has already abandoned it)."""
    try:
        con.rollback()
    except duckdb.Error:
        logger.debug("rollback after a failed write: the transaction was already abandoned")


def sql_row_over_frames(name: str, **relations: pl.DataFrame) -> dict[str, Any]:
    """The one row `sql/<name>.sql` returns over in-memory frames registered under the names its
    contract reads (no warehouse: its own views, e.g. `outcomes`, must not shadow them)."""
    with duckdb.connect() as con:
        for relation, frame in relations.items():
            con.register(relation, frame.to_arrow())
        return con.execute(load_sql(name)).pl().row(0, named=True)


def _to_arrow(rows: Iterable[Any] | pl.DataFrame | pa.Table) -> pa.Table:
    """Rows as an arrow table. Records (dataclasses, one class per batch) are read column by column:
    their fields are flat values, and `dataclasses.asdict` deep-copies every list and datetime, which
    made the conversion cost more than the insert."""
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pl.DataFrame):
        return rows.to_arrow()
    rows = list(rows)
    if rows and all(dataclasses.is_dataclass(row) and type(row) is type(rows[0]) for row in rows):
        names = [field.name for field in dataclasses.fields(rows[0])]
        return pa.table({name: [getattr(row, name) for row in rows] for name in names})
    return pa.Table.from_pylist([dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in rows])
