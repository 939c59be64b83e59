"""The replay-mixed6-vote pool through the real assets: the vote seat is no probe partition, has no
pass rate or ceiling, and is no solo arm; evaluation still draws its slice from what every replay
seat recorded. A tmp warehouse over a small MATH level-5 slice."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from assets.evaluation import eval_arms, eval_tables
from assets.probing import oracle_ceilings, pass_rates, pool_probing_definitions
from conductor_pipeline.corpora.loaders import load_math_full
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.probing.runner import probe_and_close, select_questions
from conductor_pipeline.splits import split_of
from conductor_pipeline.warehouse import Warehouse
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

POOL = "replay-mixed6-vote"
SOLO = ["gpt-4o", "claude-3.5-sonnet", "gemini-1.5-pro", "llama-3.1-405b", "deepseek-v2.5", "llama-3.1-8b"]
N_TRAIN, N_EVAL = 24, 8
POOL_PROBING = pool_probing_definitions(POOL)


@pytest.fixture
def warehouse_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Level-5 MATH questions the six seats recorded: some train-split (probed: the best single's
    calibration), some eval-split, and a few nobody recorded, which the eval slice must leave out."""
    require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs", "math_full")
    level5 = sorted((q for q in load_math_full() if q.split == "test" and q.level == 5), key=lambda q: q.question_id)
    covered = set.intersection(*(set(w.question_ids) for w in build_workers(load_pool("replay-mixed6")).values()))
    train = [q for q in level5 if q.question_id in covered and split_of(q.question_id) == "train"][:N_TRAIN]
    evaluated = [q for q in level5 if q.question_id in covered and split_of(q.question_id) == "eval"][:N_EVAL]
    unrecorded = [q for q in level5 if q.question_id not in covered and split_of(q.question_id) == "eval"][:4]
    path = tmp_path / "warehouse.duckdb"
    Warehouse(path).insert("questions", train + evaluated + unrecorded)
    return path


def resources(path: Path) -> dict:
    return {"warehouse": WarehouseResource(database=str(path)), "pool": PoolResource(pool=POOL)}


def train_questions(store: Warehouse) -> list:
    slice_ = select_questions(store, corpora=["math"], splits=["test"], math_levels=[5])
    return [q for q in slice_ if split_of(q.question_id) == "train"]


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    (event,) = result.asset_materializations_for_node(asset)
    return {key: value.value for key, value in event.metadata.items()}


def test_the_vote_seat_is_not_probed_and_has_no_pass_rate_or_ceiling(warehouse_path: Path) -> None:
    assert POOL_PROBING.partitions.get_partition_keys() == SOLO
    result = dg.materialize(
        [POOL_PROBING.probe_calls, pass_rates, oracle_ceilings],
        resources=resources(warehouse_path),
        tags={"dagster/asset_partition_range_start": SOLO[0], "dagster/asset_partition_range_end": SOLO[-1]},
    )
    assert result.success
    probed = Warehouse(warehouse_path).query("SELECT DISTINCT worker FROM calls WHERE kind = 'probe' ORDER BY worker")
    assert probed["worker"].to_list() == sorted(SOLO)
    rates, ceilings = metadata(result, "pass_rates"), metadata(result, "oracle_ceilings")
    assert "majority-vote" not in rates["worker_accuracy"] and "majority-vote" not in ceilings["ceilings"]
    assert "without llama-3.1-8b" in ceilings["ceilings"]


def test_probing_the_library_way_skips_the_vote_with_a_log_line(warehouse_path: Path) -> None:
    pool = load_pool(POOL)
    store = Warehouse(warehouse_path)
    questions = train_questions(store)[:3]
    logged: list[str] = []
    summary = probe_and_close(
        store, pool, build_workers(pool), questions, samples=1, temperature=0.2, run_id="r",
        governor_factory=lambda: Governor.from_pool(pool), log=logged.append, only_recorded=True,
    )
    assert any("not probing ['majority-vote']" in line and "never alone" in line for line in logged)
    assert summary.written == 3 * len(SOLO) and "majority-vote" not in summary.per_worker_status


def test_eval_arms_are_the_solo_seats_on_the_recorded_slice(warehouse_path: Path) -> None:
    pool = load_pool(POOL)
    store = Warehouse(warehouse_path)
    train = train_questions(store)
    probe_and_close(
        store, pool, build_workers(pool), train, samples=1, temperature=0.2, run_id="probe",
        governor_factory=lambda: Governor.from_pool(pool), log=lambda line: None, only_recorded=True,
    )
    config = {
        "slice_size": 20, "use_conductor_resource": False, "use_trained_checkpoint": False,
        "world_model_router": False,
    }
    result = dg.materialize(
        [eval_arms],
        resources=resources(warehouse_path) | {"conductor": ConductorPolicyResource()},
        run_config={"ops": {"eval_arms": {"config": config}}},
    )
    assert result.success
    summary = result.output_for_node("eval_arms")
    # Solo arms are exactly the seats that answer alone; the baselines follow them.
    assert [arm for arm in summary.arms if arm.startswith("solo:")] == [f"solo:{name}" for name in SOLO]
    assert list(summary.arms)[len(SOLO):len(SOLO) + 3] == ["best_single", "random", "oracle"]
    assert not any("majority-vote" in arm for arm in summary.arms)
    # Only what every replay seat recorded: the vote seat (no recordings) does not lift the restriction.
    assert summary.extra["restricted_to_recorded"] is True and len(summary.slice_ids) == N_EVAL
    assert summary.best_single_worker in SOLO


def test_eval_tables_publish_each_conductor_arms_fan_out_share(warehouse_path: Path) -> None:
    """On a pool with a vote seat, eval_tables publishes the share of each conductor arm's workflows
    that fanned out and aggregated (the tiny offline conductor, one question per eval slice row)."""
    pool = load_pool(POOL)
    store = Warehouse(warehouse_path)
    probe_and_close(
        store, pool, build_workers(pool), train_questions(store), samples=1, temperature=0.2, run_id="probe",
        governor_factory=lambda: Governor.from_pool(pool), log=lambda line: None, only_recorded=True,
    )
    config = {
        "slice_size": 4, "use_trained_checkpoint": False, "world_model_router": False, "vote_arms": False,
        "include_untrained": True,
    }
    result = dg.materialize(
        [eval_arms, eval_tables],
        resources=resources(warehouse_path) | {"conductor": ConductorPolicyResource(device="cpu")},
        run_config={"ops": {"eval_arms": {"config": config}}},
    )
    assert result.success
    summary = result.output_for_node("eval_arms")
    assert summary.extra["aggregators"] == ("majority-vote",)
    conductors = [arm for arm in summary.arms if arm.startswith("conductor")]
    assert len(conductors) == 2  # the pool-file order and the shuffled catalogue
    table = metadata(result, "eval_tables")["fan_out"]
    assert all(conductor in table for conductor in conductors) and "share" in table
    assert not any(arm in table for arm in summary.arms if arm.startswith("solo:"))
