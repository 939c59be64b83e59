"""The Kubernetes profile: loads, validates, and places each step where it belongs (no cluster needed)."""

# No `from __future__ import annotations`: Dagster reads the context annotation as a class.
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster_k8s.job import get_user_defined_k8s_config

from assets.definitions import build_definitions
from assets.deployment import (
    GIT_COMMIT_ENV,
    GPU_POOL,
    K8S_CONFIG_TAG,
    PROFILE_ENV,
    SHARED_ARTIFACTS_ROOT,
    SharedStorageError,
    git_commit,
    in_pool,
    k8s_definitions,
    profile_from_env,
    run_tags,
    with_job_tags,
    with_op_tags,
)
from conductor_pipeline.paths import ARTIFACTS_ENV, PROJECT_ROOT
from conductor_pipeline.reproducibility import cpu_signature
from resources.pool import DEFAULT_POOL
from resources.trainer import TrainerResource
from resources.warehouse import WAREHOUSE_ENV, WarehouseResource


@dg.asset(pool=GPU_POOL, op_tags={"team": "training"})
def gpu_trained(context: dg.AssetExecutionContext, upstream_rows: int) -> int:
    """Stands in for a training asset: in the gpu pool, with an upstream input and its own op tag."""
    return upstream_rows * 2


@dg.asset
def upstream_rows() -> int:
    return 21


def _step_k8s_config(defs: dg.Definitions, asset_key: str) -> dict:
    """The k8s config the step executor will read from this asset's step tags."""
    job = defs.resolve_implicit_global_asset_job_def()
    node = next(n for n in job.graph.nodes if n.definition.name == defs.get_assets_def(asset_key).op.name)
    return get_user_defined_k8s_config(node.tags).to_dict()


@pytest.fixture(scope="module")
def project_defs(tmp_path_factory: pytest.TempPathFactory) -> dg.Definitions:
    """The project's definitions with the artifacts root on "shared storage" (outside the project)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ARTIFACTS_ENV, str(tmp_path_factory.mktemp("shared-volume")))
        env.delenv(WAREHOUSE_ENV, raising=False)
        return build_definitions(DEFAULT_POOL)


@pytest.fixture(scope="module")
def k8s_project_defs(project_defs: dg.Definitions) -> dg.Definitions:
    return k8s_definitions(project_defs)


def test_project_definitions_load_and_validate_under_k8s_profile(
    k8s_project_defs: dg.Definitions, project_defs: dg.Definitions
) -> None:
    dg.Definitions.validate_loadable(k8s_project_defs)
    for job in k8s_project_defs.resolve_all_job_defs():
        assert job.executor_def.name == "k8s_step_per_pod", job.name
    assert set(k8s_project_defs.resolve_all_asset_keys()) == set(project_defs.resolve_all_asset_keys())


def test_probe_partitions_fan_out_as_one_run_per_worker(
    k8s_project_defs: dg.Definitions, project_defs: dg.Definitions
) -> None:
    probe = k8s_project_defs.get_assets_def("probe_calls")
    assert probe.backfill_policy == dg.BackfillPolicy.multi_run(1)
    # The local definitions keep probing every worker in one run (one governor, one process).
    assert project_defs.get_assets_def("probe_calls").backfill_policy == dg.BackfillPolicy.single_run()


def test_gpu_pool_steps_request_a_gpu_and_others_only_cpu(k8s_project_defs: dg.Definitions) -> None:
    assets = [k8s_project_defs.get_assets_def(key) for key in k8s_project_defs.resolve_all_asset_keys()]
    assets = [a for a in assets if a.is_executable]
    gpu_assets = [a for a in assets if in_pool(a, GPU_POOL)]
    assert gpu_assets, "no project asset is in the gpu pool (training assets not registered?)"
    for asset in assets:
        resources = _step_k8s_config(k8s_project_defs, asset.key)["container_config"].get("resources", {})
        if asset in gpu_assets:
            assert resources["requests"]["nvidia.com/gpu"] == "1"
            assert resources["limits"]["nvidia.com/gpu"] == "1"
        else:  # CPU/memory come from the executor's step defaults, merged into every step pod
            assert "nvidia.com/gpu" not in resources.get("requests", {})
    job = k8s_project_defs.resolve_implicit_global_asset_job_def()
    execution = dg.validate_run_config(job, {})["execution"]["k8s_step_per_pod"]
    step_defaults = execution["step_k8s_config"]["container_config"]["resources"]
    assert step_defaults["requests"].keys() == {"cpu", "memory"}


def test_profile_retags_a_gpu_asset_and_the_rebuilt_step_still_computes() -> None:
    base = dg.Definitions(assets=[upstream_rows, gpu_trained])
    profiled = k8s_definitions(base)
    dg.Definitions.validate_loadable(profiled)

    config = _step_k8s_config(profiled, "gpu_trained")
    assert config["container_config"]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert config["pod_spec_config"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    tagged = profiled.get_assets_def("gpu_trained")
    assert tagged.op.tags["team"] == "training" and tagged.op.pool == GPU_POOL
    assert K8S_CONFIG_TAG not in profiled.get_assets_def("upstream_rows").op.tags

    result = dg.materialize([upstream_rows, with_op_tags(gpu_trained, {"extra": "x"})])
    assert result.success and result.output_for_node("gpu_trained") == 42


def test_profile_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    base = dg.Definitions(assets=[upstream_rows])
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    assert profile_from_env(base) is base
    monkeypatch.setenv(PROFILE_ENV, "k8s")
    assert profile_from_env(base).executor.name == "k8s_step_per_pod"
    monkeypatch.setenv(PROFILE_ENV, "slurm")
    with pytest.raises(ValueError, match="CORYPHAEUS_PROFILE"):
        profile_from_env(base)


def test_cluster_pool_file_points_every_seat_at_an_in_cluster_openai_endpoint() -> None:
    from conductor_pipeline.paths import PROJECT_ROOT
    from conductor_pipeline.pools.config import load_pool

    pool = load_pool(PROJECT_ROOT / "deploy" / "k8s" / "pool-qwen-k8s.yaml")
    for seat in pool.workers:
        assert seat.backend == "openai" and seat.api_key_env is None
        assert seat.endpoint.endswith(".svc.cluster.local:8000/v1"), seat.endpoint


def test_k8s_profile_refuses_artifacts_inside_the_project(monkeypatch: pytest.MonkeyPatch) -> None:
    """In its own pod every step has its own project folder: a manifest written there reaches no other step."""
    monkeypatch.delenv(ARTIFACTS_ENV)
    monkeypatch.delenv(WAREHOUSE_ENV, raising=False)
    with pytest.raises(SharedStorageError, match=r"warehouse.database.*trainer.output_root.*CORYPHAEUS_ARTIFACTS"):
        k8s_definitions(build_definitions(DEFAULT_POOL))
    shared = dg.Definitions(resources={"warehouse": WarehouseResource(database="/data/w.duckdb", artifacts_root="/data"),
                                       "trainer": TrainerResource(output_root=str(PROJECT_ROOT / "artifacts"))})
    with pytest.raises(SharedStorageError, match=r"\{'trainer.output_root'"):
        k8s_definitions(shared)


def test_helm_values_put_the_artifacts_root_on_the_shared_volume() -> None:
    values = yaml.safe_load((PROJECT_ROOT / "deploy" / "k8s" / "values.yaml").read_text())
    [deployment] = values["dagster-user-deployments"]["deployments"]
    env = {item["name"]: item["value"] for item in deployment["env"]}
    assert env[ARTIFACTS_ENV] == SHARED_ARTIFACTS_ROOT and WAREHOUSE_ENV not in env  # the warehouse follows the root
    mounts = [m["mountPath"] for m in deployment["volumeMounts"]]
    run_mounts = [m["mountPath"] for m in values["runLauncher"]["config"]["k8sRunLauncher"]["volumeMounts"]]
    for mounted in (mounts, run_mounts):
        assert any(Path(SHARED_ARTIFACTS_ROOT).is_relative_to(m) for m in mounted), mounted


def test_runs_carry_the_pool_the_commit_the_profile_and_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GIT_COMMIT_ENV, raising=False)
    assert git_commit() != "unknown"  # this checkout is a git work tree
    monkeypatch.setenv(GIT_COMMIT_ENV, "abc123")
    monkeypatch.setenv(PROFILE_ENV, "local")
    assert run_tags("replay-mixed6") == {
        "pool": "replay-mixed6", "git_commit": "abc123", "profile": "local", "cpu": cpu_signature(),
    }
    (job,) = with_job_tags([dg.define_asset_job("rows_job", selection=[upstream_rows], tags={"team": "x"})],
                           run_tags("replay-mixed6"))
    result = dg.Definitions(assets=[upstream_rows], jobs=[job]).resolve_job_def("rows_job").execute_in_process()
    assert result.success
    tags = result.dagster_run.tags
    assert (tags["pool"], tags["git_commit"], tags["profile"]) == ("replay-mixed6", "abc123", "local")
    assert tags["team"] == "x"  # the job's own tags stay
    # The project's main and training jobs carry them.
    assert build_definitions(DEFAULT_POOL).resolve_job_def("eval_job").tags["git_commit"] == "abc123"
