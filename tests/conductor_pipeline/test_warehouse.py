"""The warehouse: schema, idempotent writes by key, and several processes writing at once."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import subprocess
import sys
from datetime import datetime

import duckdb
import pytest

from conductor_pipeline.paths import PROJECT_ROOT
from conductor_pipeline.records import Question
from conductor_pipeline.warehouse import Warehouse, load_sql
from tests.builders import make_call, make_workflow


def test_schema_has_the_contract_relations(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    with wh.connect() as con:
        names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert {"questions", "calls", "workflows", "training_steps", "outcomes"} <= names


def test_insert_is_idempotent_by_key(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    calls = [make_call(i) for i in range(50)]
    assert wh.insert("calls", calls) == 50
    assert wh.insert("calls", calls[:20] + [make_call(50)]) == 1
    assert wh.query("SELECT count(*) AS n FROM calls")["n"][0] == 51


def test_a_transient_row_gives_way_to_the_reissued_call_and_nothing_else_does(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.insert("calls", [make_call(1, correct=None), make_call(2, correct=True)])  # c1 transient, c2 ok
    reissued = [make_call(1, correct=False), make_call(2, correct=False)]
    assert wh.insert("calls", reissued) == 1  # c1 replaced; c2 already scored, so kept as it was
    rows = wh.query("SELECT call_id, status, correct FROM calls ORDER BY call_id").rows()
    assert rows == [("c1-w", "ok", False), ("c2-w", "ok", True)]
    assert wh.insert("calls", [make_call(1, correct=None)]) == 0  # a new fault never overwrites a verdict


def test_a_failed_batch_writes_nothing(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.insert("calls", [make_call(1, correct=None)])
    broken = [make_call(1, correct=True), dataclasses.replace(make_call(2), run_id=None)]  # run_id is NOT NULL
    with pytest.raises(duckdb.ConstraintException, match="run_id"):
        wh.insert("calls", broken)
    assert wh.query("SELECT status FROM calls").rows() == [("transient",)]  # the delete was rolled back


def test_rows_for_several_tables_land_together_or_not_at_all(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    workflow = make_workflow("wf1")
    assert wh.insert_tables({"calls": [make_call(1)], "workflows": [workflow], "questions": []}) == {
        "calls": 1, "workflows": 1, "questions": 0,
    }
    broken = dataclasses.replace(make_workflow("wf2"), run_id=None)  # run_id is NOT NULL
    with pytest.raises(duckdb.ConstraintException, match="run_id"):
        wh.insert_tables({"calls": [make_call(2)], "workflows": [broken]})
    assert wh.query("SELECT count(*) AS n FROM calls")["n"][0] == 1  # the calls before it were rolled back
    with pytest.raises(ValueError, match="'answers'"):
        wh.insert_tables({"calls": [make_call(3)], "answers": [{}]})


STORE_NOON_UTC = """
import sys
from dataclasses import replace
from datetime import UTC, datetime
from conductor_pipeline.warehouse import Warehouse
from tests.builders import make_call
wh = Warehouse(sys.argv[1])
wh.insert("calls", [replace(make_call(1), started_at=datetime(2026, 1, 1, 12, 0, tzinfo=UTC)), make_call(2)])
"""


def test_an_aware_timestamp_is_stored_as_utc_whatever_the_host_zone(tmp_path):
    # DuckDB takes the host zone when the process starts, so the write runs in a child process.
    env = {**os.environ, "TZ": "America/New_York", "PYTHONPATH": str(PROJECT_ROOT)}
    subprocess.run([sys.executable, "-c", STORE_NOON_UTC, str(tmp_path / "w.duckdb")], env=env, check=True)
    stored = dict(Warehouse(tmp_path / "w.duckdb").query("SELECT call_id, started_at FROM calls").rows())
    assert stored == {"c1-w": datetime(2026, 1, 1, 12, 0), "c2-w": datetime(2026, 1, 1)}  # naive values kept as is


def test_questions_round_trip(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    q = Question("test/algebra/1.json", "math", "test", "1+1?", "2", "Algebra", 1, True)
    wh.insert("questions", [q, q])
    row = wh.query("SELECT * FROM questions").row(0, named=True)
    assert row["question_id"] == "test/algebra/1.json" and row["level"] == 1 and row["in_math500"]


def test_records_and_the_same_rows_as_dicts_are_stored_alike(tmp_path):
    # Records are read column by column; dicts row by row: lists, None and datetimes must agree.
    workflows = [
        dataclasses.replace(make_workflow("wf1"), workers=["a", "b"], catalogue=["b", "a", "c"]),
        dataclasses.replace(make_workflow("wf2"), workers=[], catalogue=None, correct=None),
    ]
    calls = [make_call(1), dataclasses.replace(make_call(2), started_at=None, response=None)]
    as_records, as_dicts = Warehouse(tmp_path / "records.duckdb"), Warehouse(tmp_path / "dicts.duckdb")
    as_records.insert_tables({"calls": calls, "workflows": workflows})
    as_dicts.insert_tables({
        "calls": [dataclasses.asdict(c) for c in calls], "workflows": [dataclasses.asdict(w) for w in workflows],
    })
    for table, key in (("calls", "call_id"), ("workflows", "workflow_id")):
        stored = [wh.query(f"SELECT * FROM {table} ORDER BY {key}").rows() for wh in (as_records, as_dicts)]
        assert stored[0] == stored[1] and len(stored[0]) == 2
    assert as_records.query("SELECT catalogue FROM workflows ORDER BY workflow_id").rows() == [(["b", "a", "c"],), (None,)]


def test_writes_stay_in_the_log_until_it_holds_enough_and_every_reader_sees_them(tmp_path, monkeypatch):
    import conductor_pipeline.warehouse as warehouse_module

    path = tmp_path / "w.duckdb"
    wal = tmp_path / "w.duckdb.wal"
    wh = Warehouse(path)
    wh.insert("calls", [make_call(0)])
    assert not wal.exists()  # the connection that applied the schema folds it in
    wh.insert_tables({"calls": [make_call(1)], "workflows": [make_workflow("wf1")]})
    assert wal.is_file()  # closing did not fold the small write into the file
    with duckdb.connect(str(path), read_only=True) as outside:  # a DuckDB shell replays the log
        assert outside.execute("SELECT count(*) FROM calls").fetchone()[0] == 2
    monkeypatch.setattr(warehouse_module, "WAL_FOLD_BYTES", 1)
    wh.insert("calls", [make_call(2)])
    assert not wal.exists()  # the log had grown past the threshold: folded on close
    fresh = Warehouse(path)  # applies the schema again over the folded file
    assert fresh.query("SELECT count(*) AS n FROM calls")["n"][0] == 3
    assert fresh.query("SELECT catalogue FROM workflows").rows() == [(make_workflow("wf1").catalogue,)]


def test_outcomes_view_is_the_majority_of_scored_samples(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    rows = []
    # q0 x a: 2 of 3 correct -> solved; q0 x b: 1 of 2 -> a tie is not solved; unscored rows ignored.
    for sample, correct in enumerate([True, True, False]):
        rows.append(make_call(0, worker="a", correct=correct))
        rows[-1].call_id, rows[-1].sample, rows[-1].question_id = f"a{sample}", sample, "q0"
    for sample, correct in enumerate([True, False, None]):
        rows.append(make_call(0, worker="b", correct=correct))
        rows[-1].call_id, rows[-1].sample, rows[-1].question_id = f"b{sample}", sample, "q0"
    wh.insert("calls", rows)
    outcomes = dict(wh.query("SELECT worker, correct FROM outcomes ORDER BY worker").iter_rows())
    assert outcomes == {"a": True, "b": False}


def test_unknown_table_and_unknown_sql_file_are_refused(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    with pytest.raises(ValueError, match="unknown warehouse table"):
        wh.insert("calls; DROP TABLE calls", [])
    with pytest.raises(FileNotFoundError, match="no SQL file"):
        load_sql("does_not_exist")


def _write_many(path: str, worker: str, n: int, batch: int) -> None:
    wh = Warehouse(path)
    for start in range(0, n, batch):
        wh.insert("calls", [make_call(i, worker=worker) for i in range(start, start + batch)])


def test_parallel_processes_never_fail_on_the_duckdb_lock(tmp_path):
    path = str(tmp_path / "w.duckdb")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(path, f"w{k}", 400, 20)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    counts = Warehouse(path).query("SELECT worker, count(*) AS n FROM calls GROUP BY worker ORDER BY worker")
    assert counts["n"].to_list() == [400] * 4
