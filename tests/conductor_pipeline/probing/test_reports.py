"""The probing tables: columns in status order, missing values shown as such, the null-pool reading."""

from __future__ import annotations

import polars as pl

from conductor_pipeline.probing.ceilings import ceiling_table, null_pool_table, whole_pool_row, widest_null_pool_row
from conductor_pipeline.probing.reports import (
    STATUSES,
    ceilings_markdown,
    null_pool_note,
    status_count_markdown,
    worker_pass_rate_histogram_markdown,
)


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_status_counts_have_every_status_in_declared_order_and_a_total() -> None:
    lines = status_count_markdown({"a": {"ok": 3, "transient": 1}, "b": {}}).splitlines()
    assert cells(lines[0]) == ["worker", "ok", "truncated", "empty", "transient", "terminal", "not_recorded", "total"]
    assert STATUSES == tuple(cells(lines[0])[1:-1])
    assert cells(lines[2]) == ["a", "3", "0", "0", "1", "0", "0", "4"] and cells(lines[3])[-1] == "0"


def test_histogram_counts_each_workers_questions_per_bin() -> None:
    rates = pl.DataFrame({"worker": ["a", "a", "a", "b"], "pass_rate": [0.0, 1.0, 1.0, 0.5]})
    lines = worker_pass_rate_histogram_markdown(rates, ["a", "b"]).splitlines()
    a, b = cells(lines[2]), cells(lines[3])
    assert a[0] == "a" and a[1] == "1" and a[-1] == "2" and sum(map(int, a[1:])) == 3
    assert b[0] == "b" and sum(map(int, b[1:])) == 1


def test_ceilings_and_the_null_pool_note() -> None:
    outcomes = pl.DataFrame({"question_id": ["q1", "q1", "q2", "q2"], "worker": ["a", "b", "a", "b"],
                             "correct": [True, False, False, False]})
    samples = pl.DataFrame({"question_id": ["q1", "q1", "q2", "q2"], "worker": ["a"] * 4, "sample": [0, 1, 0, 1],
                            "correct": [True, False, False, True]})
    real = ceiling_table(outcomes, ["a", "b"])
    assert widest_null_pool_row(real) is None
    assert "no null pool" in null_pool_note(whole_pool_row(real), None)

    table = pl.concat([real, null_pool_table(samples, pool_size=2)])
    widest = widest_null_pool_row(table)
    assert widest is not None and widest["size"] == 2 and widest["headroom"] == 0.5
    note = null_pool_note(whole_pool_row(table), widest)
    assert note.startswith("Null pool: 2 independent samples of a alone show 0.5 headroom, against 0.0 for the real pool")
    rows = ceilings_markdown(table).splitlines()
    assert cells(rows[2])[:3] == ["pool", "2", "2"] and cells(rows[-1])[0] == "null: 2 samples of a"
