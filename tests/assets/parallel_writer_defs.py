"""Four writer assets with no dependencies between them, for the parallel-writer test.

A module (not the test file) so Dagster's multiprocess executor can re-import the job in
each step's subprocess.
"""

from __future__ import annotations

import os

from dagster import AssetsDefinition, Definitions, asset, define_asset_job, multiprocess_executor

from resources.warehouse import WarehouseResource
from tests.builders import make_call

ROWS_PER_WRITER = 300
BATCH = 10


def _writer(name: str) -> AssetsDefinition:
    @asset(name=name)
    def write_calls(warehouse: WarehouseResource) -> None:
        wh = warehouse.get_warehouse()
        for start in range(0, ROWS_PER_WRITER, BATCH):
            wh.insert("calls", [make_call(i, worker=name) for i in range(start, start + BATCH)])
        # Reads go through the same lock: a read between other steps' writes must not fail either.
        with warehouse.get_connection() as con:
            con.execute("SELECT count(*) FROM calls").fetchone()

    return write_calls


WRITERS = [_writer(f"writer_{k}") for k in range(4)]

defs = Definitions(
    assets=WRITERS,
    jobs=[define_asset_job("parallel_writers", selection=[w.key for w in WRITERS])],
    resources={"warehouse": WarehouseResource(database=os.environ.get("PARALLEL_WRITER_DB", "unset.duckdb"))},
    executor=multiprocess_executor.configured({"max_concurrent": 4}),
)


def parallel_writers_job():
    return defs.resolve_job_def("parallel_writers")
