"""Dagster's multiprocess executor runs four warehouse writers at once; none fails on DuckDB's lock."""

from __future__ import annotations

from dagster import DagsterInstance, execute_job, reconstructable

from conductor_pipeline.warehouse import Warehouse
from tests.assets.parallel_writer_defs import ROWS_PER_WRITER, parallel_writers_job


def test_parallel_steps_all_write_everything(tmp_path, monkeypatch):
    db = tmp_path / "w.duckdb"
    monkeypatch.setenv("PARALLEL_WRITER_DB", str(db))
    # Each step's subprocess re-imports the defs module and reads the variable there.
    home = tmp_path / "dagster_home"
    home.mkdir()
    with DagsterInstance.local_temp(str(home)) as instance:
        result = execute_job(reconstructable(parallel_writers_job), instance=instance)
        assert result.success
        spans: dict[str, list[float]] = {}
        for record in instance.all_logs(result.run_id):
            event = record.dagster_event
            if event and event.event_type_value in ("STEP_START", "STEP_SUCCESS"):
                spans.setdefault(event.step_key, []).append(record.timestamp)
        assert len(spans) == 4
        # The steps really ran at the same time: at least two of them overlapped.
        intervals = sorted((start, end) for start, end in spans.values())
        assert any(later[0] < earlier[1] for earlier, later in zip(intervals, intervals[1:]))
    counts = Warehouse(db).query("SELECT worker, count(*) AS n FROM calls GROUP BY worker ORDER BY worker")
    assert counts["worker"].to_list() == [f"writer_{k}" for k in range(4)]
    assert counts["n"].to_list() == [ROWS_PER_WRITER] * 4
