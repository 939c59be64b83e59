"""The definitions are a function of the pool: importing them reads no setting, loading them reads
$CORYPHAEUS_POOL, and `build_definitions(pool)` needs no environment at all."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import pytest

from assets.definitions import MAIN_JOBS, build_definitions, defs
from assets.probing import PROBE_CALLS
from conductor_pipeline.paths import PROJECT_ROOT
from conductor_pipeline.pools.config import load_pool
from resources.pool import DEFAULT_POOL, POOL_ENV

OTHER_POOL = "replay-routerdc"


def probe_partition_keys(definitions) -> list[str]:
    return definitions.get_assets_def(PROBE_CALLS).partitions_def.get_partition_keys()


def test_build_definitions_follows_the_pool_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_ENV, DEFAULT_POOL)
    built = build_definitions(OTHER_POOL)
    assert probe_partition_keys(built) == load_pool(OTHER_POOL).worker_names
    assert built.resources["pool"].pool == OTHER_POOL
    workers = load_pool(OTHER_POOL).worker_names
    request = built.resolve_schedule_def("reprobe_schedule")(dg.build_schedule_context())
    assert request.partition_key_range == dg.PartitionKeyRange(workers[0], workers[-1])


def test_loaded_definitions_follow_the_pool_named_when_they_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_ENV, OTHER_POOL)
    assert probe_partition_keys(defs()) == load_pool(OTHER_POOL).worker_names
    monkeypatch.delenv(POOL_ENV)
    assert probe_partition_keys(defs()) == load_pool(DEFAULT_POOL).worker_names


def test_importing_the_definitions_reads_no_pool() -> None:
    """A pool that does not exist breaks loading the definitions, never importing them."""
    code = (
        "import assets.definitions, assets.main\n"
        "from conductor_pipeline.pools.config import PoolConfigError\n"
        "try:\n"
        "    assets.definitions.defs()\n"
        "except PoolConfigError as exc:\n"
        "    print('load failed:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, POOL_ENV: "no-such-pool", "PYTHONPATH": str(PROJECT_ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "load failed:" in done.stdout and "no-such-pool" in done.stdout


def test_every_asset_names_its_owners_and_its_stage() -> None:
    graph = build_definitions(DEFAULT_POOL).resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.owners and all(owner.startswith("team:") for owner in node.owners), key
        assert node.tags.get("stage") == node.group_name and node.tags.get("compute") in ("cpu", "gpu"), key


@pytest.mark.parametrize("pool", ["replay-mixed6-vote", "replay-mixed6-recursive"])
def test_the_vote_and_recursive_pools_build_every_main_job(monkeypatch: pytest.MonkeyPatch, pool: str) -> None:
    """What `CORYPHAEUS_POOL=<pool> python -m assets.main` loads: every main job resolves, and only
    the seats that answer alone are probed (the vote and the conductor seat are not)."""
    monkeypatch.setenv(POOL_ENV, pool)
    loaded = defs()
    for job in MAIN_JOBS:
        loaded.resolve_job_def(job.name)
    assert loaded.resources["pool"].pool == pool
    assert probe_partition_keys(loaded) == load_pool(pool).solo_worker_names


HEAVY_LIBRARIES = ("trl", "torch", "transformers", "sklearn", "scipy.stats", "lightgbm", "pandas", "statsmodels")


def test_loading_the_definitions_leaves_the_heavy_libraries_unimported() -> None:
    """A `make run` with nothing to do, `make ui`, every Dagster subprocess and every test that starts
    the entry point load the definitions; TRL (and the torch it brings), scikit-learn, LightGBM and
    scipy.stats take seconds each to import, so the steps that train, fit W or test import them,
    not the graph."""
    code = f"import sys, assets.main; print(sorted(m for m in {HEAVY_LIBRARIES!r} if m in sys.modules))"
    imported = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert imported == "[]"
