"""pool_search end to end on a real slice in a tmp warehouse: the recordings it grades itself equal
what probing the same replay pool writes, both sources give the same table, a rerun reads the
cache, and the default pool (every ZeroEval model) runs beside the pool being run."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets.pool_search import DEFAULT_SEARCH_POOL, PoolSearchConfig, pool_search
from assets.probing import oracle_ceilings, pass_rates, pool_probing_definitions
from conductor_pipeline.corpora.loaders import load_gsm8k, load_math_full
from conductor_pipeline.paths import artifacts_root
from conductor_pipeline.probing.pool_search import PoolSearchSettings
from conductor_pipeline.warehouse import Warehouse
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

POOL = "replay-mixed6"
N_GSM8K, N_MATH = 24, 16
PROBE_CALLS = pool_probing_definitions(POOL).probe_calls
FAST = {"n_bootstrap": 50}


@pytest.fixture
def warehouse_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs", "gsm8k_test", "math_full")
    path = tmp_path / "warehouse.duckdb"
    math_level5 = [q for q in load_math_full() if q.split == "test" and q.level == 5]
    Warehouse(path).insert("questions", load_gsm8k("test")[:N_GSM8K] + math_level5[:N_MATH])
    return path


def materialize(path: Path, selection: list, config: dict | None = None) -> dg.ExecuteInProcessResult:
    workers = PoolResource(pool=POOL).load().worker_names
    search_config = {"ops": {"pool_search": {"config": {**FAST, **(config or {})}}}}
    return dg.materialize(
        selection,
        resources={"warehouse": WarehouseResource(database=str(path)), "pool": PoolResource(pool=POOL)},
        run_config=search_config if pool_search in selection else None,
        tags={"dagster/asset_partition_range_start": workers[0], "dagster/asset_partition_range_end": workers[-1]},
    )


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    return {key: value.value for key, value in result.asset_materializations_for_node(asset)[0].metadata.items()}


def test_recordings_equal_the_probed_pool_and_both_sources_agree(warehouse_path: Path) -> None:
    probed = materialize(warehouse_path, [PROBE_CALLS, pass_rates, oracle_ceilings])
    assert probed.success
    ceilings = metadata(probed, "oracle_ceilings")
    n_math = ceilings["n_questions"] - N_GSM8K  # ZeroEval recorded only some MATH level-5 questions
    assert ceilings["population"].startswith(f"Population: {ceilings['n_questions']} questions (gsm8k test {N_GSM8K}, "
                                              f"math test L5 {n_math})")
    assert "Population:" in ceilings["ceilings"]

    from_recordings = materialize(warehouse_path, [pool_search], {"pool": POOL})
    assert from_recordings.success
    first = metadata(from_recordings, "pool_search")
    assert first["outcomes_cached"] is False and first["candidates"] == 6
    # The graded recordings are exactly what the probe wrote: same questions, verdicts and costs.
    store = Warehouse(warehouse_path)
    calls = store.query("SELECT question_id, worker, correct, cost_usd FROM calls WHERE kind = 'probe'")
    cached = pl.read_parquet(next((artifacts_root() / "pool_search").glob(f"{POOL}-outcomes-*.parquet")))
    joined = calls.join(cached, on=["question_id", "worker"], how="full", coalesce=True)
    assert joined.height == calls.height == cached.height
    assert joined["correct"].to_list() == joined["correct_right"].to_list()
    assert joined["cost_usd"].to_list() == pytest.approx(joined["cost_usd_right"].to_list())

    again = metadata(materialize(warehouse_path, [pool_search], {"pool": POOL}), "pool_search")
    assert again["outcomes_cached"] is True

    from_warehouse = metadata(
        materialize(warehouse_path, [pool_search], {"pool": POOL, "source": "warehouse"}), "pool_search"
    )
    assert from_warehouse["search_table"] == first["search_table"]
    assert from_warehouse["verdict"] == first["verdict"]
    table = pl.read_parquet(first["table_path"])
    assert table.filter(pl.col("kind") == "searched")["size"].to_list() == [2, 3, 4, 5, 6]
    assert "best 2" in first["search_table"] and "no null pool can be shown" in first["search_table"]
    assert first["search_seconds"] >= 0 and "| subject" in first["subject_tables"]
    assert Path(first["report_path"]).read_text().startswith("# Pool search")


def test_the_default_pool_of_every_zeroeval_model_runs_beside_the_pool_being_run(warehouse_path: Path) -> None:
    result = materialize(warehouse_path, [pool_search])
    assert result.success
    found = metadata(result, "pool_search")
    assert found["pool"] == DEFAULT_SEARCH_POOL and found["source"] == "recordings"
    assert found["candidates"] > 20  # the models recorded on both corpora
    assert found["train_questions"] + found["eval_questions"] <= N_GSM8K + N_MATH
    assert f"| {POOL}" in found["search_table"]  # the run's own pool, re-measured for reference
    # One model recorded twice stands in for the null pool that one sample per question cannot give.
    assert "| same model, two snapshots (gpt-4o)" in found["search_table"]
    assert "Not candidates" in found["search_table"]
    assert -1 <= found["best_eval_headroom"] <= 1 and found["best_pool"]


def test_a_pool_without_recordings_fails_with_its_seats_named(warehouse_path: Path) -> None:
    result = dg.materialize(
        [pool_search],
        resources={"warehouse": WarehouseResource(database=str(warehouse_path)), "pool": PoolResource(pool=POOL)},
        run_config={"ops": {"pool_search": {"config": {"pool": "hosted-six"}}}},
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "not replay seats" in failure.step_failure_data.error.message


def test_the_config_exposes_the_library_knobs_under_their_names_help_and_defaults() -> None:
    for name, field in PoolSearchConfig.model_fields.items():
        if name in PoolSearchSettings.model_fields:
            declared = PoolSearchSettings.model_fields[name]
            assert (field.description, field.default) == (declared.description, declared.default), name
    assert PoolSearchConfig().search_settings() == PoolSearchSettings()
