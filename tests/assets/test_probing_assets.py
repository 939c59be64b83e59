"""The probing assets on a tiny real slice: replay-mixed6 over 30 questions in a tmp warehouse."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from assets.probing import (
    PROBING_JOBS,
    PROBING_SENSORS,
    oracle_ceilings,
    pass_rates,
    pool_probing_definitions,
)
from conductor_pipeline.corpora.loaders import load_gsm8k, load_math_full
from conductor_pipeline.warehouse import Warehouse
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

POOL = "replay-mixed6"
N_GSM8K, N_MATH = 18, 12
WORKERS = ["gpt-4o", "claude-3.5-sonnet", "gemini-1.5-pro", "llama-3.1-405b", "deepseek-v2.5", "llama-3.1-8b"]
ALL_PARTITIONS = {
    "dagster/asset_partition_range_start": WORKERS[0],
    "dagster/asset_partition_range_end": WORKERS[-1],
}
POOL_PROBING = pool_probing_definitions(POOL)
PROBE_CALLS = POOL_PROBING.probe_calls
PROBING_ASSETS = [PROBE_CALLS, pass_rates, oracle_ceilings]


@pytest.fixture
def warehouse_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs", "gsm8k_test", "math_full")
    path = tmp_path / "warehouse.duckdb"
    math_test = [q for q in load_math_full() if q.split == "test"]
    math_level5 = [q for q in math_test if q.level == 5]
    # Questions outside the slice (train, lower levels) must not be probed.
    outside = [q for q in math_test if q.level == 4][:5] + load_gsm8k("train")[:5]
    Warehouse(path).insert("questions", load_gsm8k("test")[:N_GSM8K] + math_level5[:N_MATH] + outside)
    return path


def materialize(path: Path, selection: list, config: dict | None = None) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        selection,
        resources={"warehouse": WarehouseResource(database=str(path)), "pool": PoolResource(pool=POOL)},
        run_config={"ops": {"probe_calls": {"config": config or {}}}},
        tags=ALL_PARTITIONS,
    )


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    events = result.asset_materializations_for_node(asset)
    assert events, f"{asset} was not materialized"
    return {key: value.value for key, value in events[0].metadata.items()}


def test_probe_then_pass_rates_and_ceilings(warehouse_path: Path) -> None:
    assert POOL_PROBING.partitions.get_partition_keys() == WORKERS
    result = materialize(warehouse_path, PROBING_ASSETS)
    assert result.success
    store = Warehouse(warehouse_path)
    recorded = store.query(
        "SELECT count(DISTINCT question_id) AS n FROM calls WHERE kind = 'probe' AND pool = 'replay-mixed6'"
    )["n"][0]
    assert N_GSM8K < recorded <= N_GSM8K + N_MATH  # ZeroEval covers 721 of the 1,324 MATH test level-5 questions

    probe = metadata(result, "probe_calls")
    # One recording per question: only sample 0 is issued (only_recorded), none of the other five.
    assert probe["calls_written"] == recorded * len(WORKERS)
    assert probe["skipped_unrecorded"] == (N_GSM8K + N_MATH) * len(WORKERS) * 6 - probe["calls_written"]
    assert "| gpt-4o" in probe["status_counts"] and "not_recorded" in probe["status_counts"]

    rates = metadata(result, "pass_rates")
    assert rates["question_worker_pairs"] == recorded * len(WORKERS)
    for worker in WORKERS:
        assert f"| {worker}" in rates["worker_accuracy"]
    assert "95% CI" in rates["worker_accuracy"] and "est." in rates["worker_accuracy"]
    assert rates["pass_rate_plot"].startswith("![pass-rate distribution per worker](data:image/png;base64,")
    assert Path(rates["pass_rate_plot_path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    ceilings = metadata(result, "oracle_ceilings")
    assert ceilings["n_questions"] == recorded
    assert 0 <= ceilings["best_single"] <= ceilings["oracle"] <= 1
    assert ceilings["headroom"] == pytest.approx(ceilings["oracle"] - ceilings["best_single"])
    for label in ("| pool ", "without llama-3.1-8b", "best 3"):
        assert label in ceilings["ceilings"]
    assert "no null pool" in ceilings["ceilings"]

    again = materialize(warehouse_path, [PROBE_CALLS])
    assert metadata(again, "probe_calls")["calls_written"] == 0
    assert metadata(again, "probe_calls")["already_written"] == recorded * len(WORKERS)
    reprobe = materialize(warehouse_path, [PROBE_CALLS], {"new_samples": True, "samples": 2})
    assert metadata(reprobe, "probe_calls")["samples"] == "1..2"  # above the highest sample written
    assert metadata(reprobe, "probe_calls")["calls_written"] == 0  # replay has no second sample to give


def test_schedule_and_definitions_resolve() -> None:
    request = POOL_PROBING.reprobe_schedule(dg.build_schedule_context())
    assert request.partition_key_range == dg.PartitionKeyRange(WORKERS[0], WORKERS[-1])
    defs = dg.Definitions(
        assets=PROBING_ASSETS,
        jobs=PROBING_JOBS,
        schedules=[POOL_PROBING.reprobe_schedule],
        sensors=PROBING_SENSORS,
        resources={"warehouse": WarehouseResource(), "pool": PoolResource(pool=POOL)},
    )
    assert defs.resolve_job_def("reprobe_job").asset_layer.executable_asset_keys == {dg.AssetKey("probe_calls")}
    assert defs.resolve_sensor_def("probing_automation_sensor") is not None
