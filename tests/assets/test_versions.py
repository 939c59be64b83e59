"""Code and data versions: a version changes with what decides an asset's result, and only then."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from assets.definitions import build_definitions
from assets.versions import (
    code_version,
    named_files,
    probe_calls_data_version,
    source_closure,
    with_code_versions,
)
from conductor_pipeline.paths import DATA_DIR, PROJECT_ROOT, SQL_DIR
from conductor_pipeline.warehouse import Warehouse
from resources.pool import PoolResource
from resources.trainer import TrainerResource
from resources.warehouse import WarehouseResource
from tests.builders import make_call

POOL = "replay-mixed6"


def relative(paths) -> set[str]:
    return {str(Path(path).relative_to(PROJECT_ROOT)) for path in paths}


def test_the_source_closure_follows_imports_into_the_library_and_nowhere_else() -> None:
    corpora = relative(source_closure("assets.corpora"))
    assert {"assets/corpora.py", "conductor_pipeline/corpora/loaders.py", "resources/warehouse.py"} <= corpora
    assert "conductor_pipeline/training/grpo.py" not in corpora
    # imports inside functions count: the GRPO module is imported lazily by the training runs
    assert "conductor_pipeline/training/grpo.py" in relative(source_closure("assets.training"))


def test_sql_and_data_files_named_in_the_sources_are_part_of_the_version() -> None:
    files = set(named_files(source_closure("assets.corpora")))
    assert {SQL_DIR / "count_questions.sql", DATA_DIR / "sources.yaml"} <= files
    assert SQL_DIR / "conductor_decomposition.sql" not in files


def test_every_asset_of_the_definitions_has_a_code_version() -> None:
    defs = build_definitions(POOL)
    versions = {key.to_user_string(): v for a in defs.assets for key, v in a.code_versions_by_key.items()}
    assert versions and all(versions.values())
    assert versions == {
        key.to_user_string(): v for a in build_definitions(POOL).assets for key, v in a.code_versions_by_key.items()
    }, "the same code and settings must give the same versions"


def test_a_changed_resource_setting_changes_the_version_of_the_assets_that_use_it_only(tmp_path: Path) -> None:
    assets = list(build_definitions(POOL).assets)

    def versions(trainer: TrainerResource) -> dict[str, str]:
        resources = {"warehouse": WarehouseResource(), "pool": PoolResource(pool=POOL), "trainer": trainer}
        return {
            key.to_user_string(): v
            for a in with_code_versions(assets, resources) for key, v in a.code_versions_by_key.items()
        }

    before, after = versions(TrainerResource()), versions(TrainerResource(seed=1))
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"warm_start_policy", "grpo_probe_run", "conductor_checkpoint"}


def test_the_pool_files_contents_are_part_of_the_version(tmp_path: Path) -> None:
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text((DATA_DIR / "pools" / f"{POOL}.yaml").read_text())
    before = code_version("assets.probing", {"pool": PoolResource(pool=str(pool_file))})
    assert code_version("assets.probing", {"pool": PoolResource(pool=str(pool_file))}) == before
    pool_file.write_text(pool_file.read_text() + "\n# a comment is a change too\n")
    assert code_version("assets.probing", {"pool": PoolResource(pool=str(pool_file))}) != before


@pytest.fixture
def store(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "warehouse.duckdb")


def probes(*indices: int, kind: str = "probe") -> list:
    return [replace(make_call(i, kind=kind), pool="p") for i in indices]


def test_the_probe_data_version_changes_with_the_pools_probe_rows_only(store: Warehouse) -> None:
    empty = probe_calls_data_version(store, "p")
    store.insert("calls", probes(0, 1, 2))
    three = probe_calls_data_version(store, "p")
    assert three != empty
    assert probe_calls_data_version(store, "p") == three, "reading the same rows gives the same version"
    store.insert("calls", probes(0, 1, 2))  # a rerun that writes nothing new
    assert probe_calls_data_version(store, "p") == three
    store.insert("calls", probes(10, 11, kind="step"))  # not a probe row
    store.insert("calls", [make_call(20)])  # another pool's
    assert probe_calls_data_version(store, "p") == three
    store.insert("calls", probes(3))  # a new sample
    assert probe_calls_data_version(store, "p") != three
