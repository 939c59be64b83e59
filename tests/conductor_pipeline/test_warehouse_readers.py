"""Processes outside the pipeline reading the warehouse: writers wait for them (and say who they
are), and the read-only replica lets them look at live telemetry without ever blocking a write.

Every reader here is a real separate process holding a real DuckDB file open, as a DuckDB shell or
a notebook would.
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pytest

from conductor_pipeline.warehouse import Warehouse, WarehouseBusyError, lock_holder, replica_path_for
from tests.builders import make_call, start_reader, stop_reader


def test_the_holder_is_read_from_duckdbs_own_message(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    Warehouse(path).insert("calls", [make_call(0)])
    reader, _ = start_reader(path)
    try:
        with pytest.raises(duckdb.IOException) as refused:
            duckdb.connect(str(path))
    finally:
        stop_reader(reader)
    assert lock_holder(str(refused.value)).startswith(f"PID {reader.pid} (")
    assert lock_holder("IO Error: Cannot open file: No such file or directory") is None
    user_message = 'Could not set lock on file "/w.duckdb": Conflicting lock is held in /bin/duckdb (PID 7) by user ana.'
    assert lock_holder(user_message) == "PID 7 (/bin/duckdb, user ana)"


def test_a_writer_waits_for_an_outside_reader_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    Warehouse(path).insert("calls", [make_call(0)])
    reader, _ = start_reader(path)  # holds the file until let go
    waits: list[str] = []

    def on_wait(line: str) -> None:
        waits.append(line)
        if len(waits) == 1:
            stop_reader(reader)  # the reader closes once the writer says it is waiting for it

    store = Warehouse(path, busy_timeout_s=60, on_wait=on_wait)
    assert store.insert("calls", [make_call(i) for i in range(1, 11)]) == 10
    assert waits and f"held by PID {reader.pid} (" in waits[0]
    assert store.query("SELECT count(*) AS n FROM calls")["n"][0] == 11


def test_the_wait_is_bounded_and_the_error_names_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    Warehouse(path).insert("calls", [make_call(0)])
    store = Warehouse(path, busy_timeout_s=1.0, replica_path=replica_path_for(path), on_wait=lambda _: None)
    reader, _ = start_reader(path)
    try:
        with pytest.raises(WarehouseBusyError, match=rf"held by PID {reader.pid} .*read-only replica .*w-replica"):
            store.insert("calls", [make_call(1)])
    finally:
        stop_reader(reader)


def test_a_reader_on_the_replica_never_blocks_writes_and_keeps_its_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    replica = replica_path_for(path)
    store = Warehouse(path, busy_timeout_s=60, replica_path=replica, replica_interval_s=0.0,
                      on_wait=lambda line: pytest.fail(f"a writer waited: {line}"))
    store.insert("calls", [make_call(0)])
    assert replica == tmp_path / "w-replica.duckdb" and replica.is_file()
    reader, seen_at_open = start_reader(replica)
    for batch in range(1, 6):
        store.insert("calls", [make_call(batch * 10 + i) for i in range(10)])
    held_count = stop_reader(reader)
    assert (seen_at_open, held_count) == (1, 1)  # one consistent snapshot for as long as it is held
    with duckdb.connect(str(replica), read_only=True) as fresh:
        assert fresh.execute("SELECT count(*) FROM calls").fetchone()[0] == 51


def test_refreshes_are_throttled_while_writing_and_caught_up_after(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    replica = replica_path_for(path)
    store = Warehouse(path, replica_path=replica, replica_interval_s=3600)
    store.insert("calls", [make_call(0)])  # the first batch makes the replica
    store.insert("calls", [make_call(1)])  # too soon after: not copied

    def replica_rows() -> int:
        with duckdb.connect(str(replica), read_only=True) as con:
            return con.execute("SELECT count(*) FROM calls").fetchone()[0]

    assert replica_rows() == 1
    time.sleep(0.05)  # file times are coarse: a copy in the same tick as the write counts as stale
    assert store.refresh_replica() and replica_rows() == 2
    assert not store.refresh_replica()  # nothing new since
    assert not Warehouse(tmp_path / "other.duckdb").refresh_replica()  # no replica configured
