"""Through the real entry points: a probe of replay-mixed6 writes versioned verdicts; when they
are marked as an older grader's, the pass_rates asset fails naming the regrade command, and the
command makes it materialize again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets.probing import pass_rates, pool_probing_definitions
from conductor_pipeline.corpora.loaders import load_gsm8k, load_math_full
from conductor_pipeline.grading import GRADER_VERSION
from conductor_pipeline.warehouse import Warehouse
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

POOL = "replay-mixed6"
ROOT = Path(__file__).resolve().parents[2]
POOL_PROBING = pool_probing_definitions(POOL)
WORKERS = POOL_PROBING.partitions.get_partition_keys()
ALL_PARTITIONS = {
    "dagster/asset_partition_range_start": WORKERS[0],
    "dagster/asset_partition_range_end": WORKERS[-1],
}


@pytest.fixture
def warehouse_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs", "gsm8k_test", "math_full")
    path = tmp_path / "warehouse.duckdb"
    math_level5 = [q for q in load_math_full() if q.split == "test" and q.level == 5]
    Warehouse(path).insert("questions", load_gsm8k("test")[:6] + math_level5[:6])
    return path


def _materialize(path: Path, selection: list) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        selection,
        resources={"warehouse": WarehouseResource(database=str(path)), "pool": PoolResource(pool=POOL)},
        tags=ALL_PARTITIONS,
        raise_on_error=False,
    )


def test_pass_rates_refuse_an_older_graders_verdicts_until_regraded(warehouse_path: Path) -> None:
    probed = _materialize(warehouse_path, [POOL_PROBING.probe_calls, pass_rates])
    assert probed.success
    store = Warehouse(warehouse_path)
    versions = store.query("SELECT correct IS NOT NULL AS scored, grader_version, count(*) AS n FROM calls GROUP BY ALL")
    assert {(row["scored"], row["grader_version"]) for row in versions.iter_rows(named=True)} == {(True, GRADER_VERSION)}

    # The rows as the previous grader would have left them: version 1, one right answer marked wrong.
    with store.connect() as con:
        con.execute("UPDATE calls SET correct = FALSE WHERE call_id = (SELECT min(call_id) FROM calls WHERE correct)")
        con.execute("UPDATE calls SET grader_version = '1'")
    stale = _materialize(warehouse_path, [pass_rates])
    assert not stale.success
    [failure] = [event for event in stale.all_events if event.event_type_value == "STEP_FAILURE"]
    message = failure.step_failure_data.error.message
    assert f"older grader than version {GRADER_VERSION}" in message
    assert f"python -m conductor_pipeline.grading.regrade --warehouse {warehouse_path} --pool {POOL}" in message

    command = [sys.executable, "-m", "conductor_pipeline.grading.regrade", "--warehouse", str(warehouse_path),
               "--pool", POOL]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
    assert "flipped 1 wrong -> correct, 0 correct -> wrong" in done.stdout
    assert _materialize(warehouse_path, [pass_rates]).success
