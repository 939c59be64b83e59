"""Deployment profiles: the same assets on Dagster's Kubernetes engines when one machine is outgrown.

`k8s_definitions(base)` returns a copy of the Definitions that
- runs every step in its own pod (`k8s_job_executor`), with CPU/memory requests on every step;
- asks for a GPU on the steps in the Dagster concurrency pool `gpu` (training, vLLM), found by
  their `pool` attribute, through `dagster-k8s/config` op tags (so the UI shows them per step);
- launches probe partitions as one run per worker (a multi-run backfill policy), so a backfill
  over the pool fans out into separate runs and pods instead of one step probing every worker;
- refuses to load unless the warehouse, the artifacts root and the trainer's output lie outside
  the project folder: each pod has its own copy of that folder, so a probe manifest one step pod
  wrote there would never reach the gate check's pod. `deploy/k8s/values.yaml` mounts a shared
  volume and sets $CORYPHAEUS_ARTIFACTS on it.

Nothing here needs a cluster to import or validate; `deploy/k8s/values.yaml` configures the
Helm chart's K8sRunLauncher that actually launches the runs. The profile is opt-in: definitions
apply it when $CORYPHAEUS_PROFILE is `k8s` (see `profile_from_env`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from conductor_pipeline.paths import ARTIFACTS_ENV, PROJECT_ROOT
from conductor_pipeline.reproducibility import cpu_signature

# Knobs, with their reason.
PROFILE_ENV = "CORYPHAEUS_PROFILE"
# The code version a run records; images built without .git set it (else `git rev-parse` is asked).
GIT_COMMIT_ENV = "CORYPHAEUS_GIT_COMMIT"
K8S_PROFILE = "k8s"
# The Dagster concurrency pool of training and vLLM steps (assets/training.py declares it on its assets).
GPU_POOL = "gpu"
K8S_CONFIG_TAG = "dagster-k8s/config"
# Every step: enough for DuckDB aggregations over a few million call rows and the replay pools.
CPU_STEP_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "1", "memory": "4Gi"},
    "limits": {"memory": "8Gi"},
}
# GPU steps: one whole GPU (GRPO on a 7B policy with LoRA, or one vLLM server), plus host RAM for
# the dataloader and checkpoint writes. Limits must equal requests for extended resources.
GPU_STEP_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
    "limits": {"memory": "96Gi", "nvidia.com/gpu": "1"},
}
# GPU nodes are usually tainted so that CPU pods stay off them.
GPU_TOLERATIONS: list[dict[str, str]] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
# Probe partitions per run in a backfill: 1 = one run (and pod) per worker.
PROBE_PARTITIONS_PER_RUN = 1
# Step pods a single run may hold at once; the gpu pool's own limit still serialises GPU steps.
MAX_CONCURRENT_STEP_PODS = 16
# Where deploy/k8s/values.yaml points $CORYPHAEUS_ARTIFACTS: on the volume every pod mounts at /data.
SHARED_ARTIFACTS_ROOT = "/data/artifacts"
# Resource settings naming files that one step pod writes and another reads.
SHARED_PATH_SETTINGS: dict[str, tuple[str, ...]] = {
    "warehouse": ("database", "artifacts_root"),
    "trainer": ("output_root",),
}


class SharedStorageError(ValueError):
    """A path steps hand files over through lies where only one pod can see it."""


def gpu_step_k8s_config() -> dict[str, Any]:
    """The `dagster-k8s/config` tag value of a GPU step (a dict: the k8s executor reads it as is)."""
    return {
        "container_config": {"resources": GPU_STEP_RESOURCES},
        "pod_spec_config": {"tolerations": GPU_TOLERATIONS},
    }


def cpu_step_k8s_config() -> dict[str, Any]:
    """The `dagster-k8s/config` tag value of every other step."""
    return {"container_config": {"resources": CPU_STEP_RESOURCES}}


def k8s_executor() -> dg.ExecutorDefinition:
    """One pod per step; every step gets the CPU defaults, GPU steps' op tags deep-merge over them."""
    from dagster_k8s import k8s_job_executor  # noqa: PLC0415 (only the k8s profile needs dagster-k8s)

    return k8s_job_executor.configured(
        {"step_k8s_config": cpu_step_k8s_config(), "max_concurrent": MAX_CONCURRENT_STEP_PODS},
        name="k8s_step_per_pod",
    )


def in_pool(asset: dg.AssetsDefinition, pool: str) -> bool:
    """True when the op computing `asset` is governed by the Dagster concurrency pool `pool`."""
    return asset.is_executable and asset.op.pool == pool


def with_op_tags(asset: dg.AssetsDefinition, extra_tags: Mapping[str, Any]) -> dg.AssetsDefinition:
    """A copy of `asset` whose op carries `extra_tags` (later keys win); the compute function is the same.

    Dagster has no public way to re-tag an existing asset's op (`op_tags` exists only on the
    decorator), so the op is rebuilt from its own parts; the test materializes a rebuilt op.
    """
    op = asset.op
    tagged_op = dg.OpDefinition(
        compute_fn=op.compute_fn,
        name=op.name,
        ins={d.name: dg.In.from_definition(d) for d in op.input_defs},
        outs={d.name: dg.Out.from_definition(d) for d in op.output_defs},
        description=op.description,
        config_schema=op.config_schema,
        required_resource_keys=op.required_resource_keys,
        tags={**op.tags, **extra_tags},
        retry_policy=op.retry_policy,
        code_version=op.version,
        pool=op.pool,
    )
    return dg.AssetsDefinition.dagster_internal_init(**{**asset.get_attributes_dict(), "node_def": tagged_op})


def _k8s_asset(asset: Any) -> Any:
    if not isinstance(asset, dg.AssetsDefinition) or not asset.is_executable:
        return asset  # AssetSpecs, source assets: nothing runs, nothing to place
    if in_pool(asset, GPU_POOL):
        asset = with_op_tags(asset, {K8S_CONFIG_TAG: gpu_step_k8s_config()})
    if asset.partitions_def is not None and asset.backfill_policy is not None:
        # A single-run policy probes every worker in one step; on a cluster each worker gets its own run.
        asset = asset.with_attributes(backfill_policy=dg.BackfillPolicy.multi_run(PROBE_PARTITIONS_PER_RUN))
    return asset


def check_shared_storage(resources: Mapping[str, Any]) -> None:
    """Fail when a warehouse or artifacts path lies inside the project folder (each pod's own copy)."""
    local = {
        f"{key}.{setting}": str(getattr(resources[key], setting))
        for key, settings in SHARED_PATH_SETTINGS.items()
        if key in resources
        for setting in settings
        if Path(getattr(resources[key], setting)).resolve().is_relative_to(PROJECT_ROOT)
    }
    if local:
        raise SharedStorageError(
            f"the k8s profile runs every step in its own pod, but {local} lie inside the project folder "
            f"{PROJECT_ROOT}, which each pod has a copy of: set ${ARTIFACTS_ENV} to a folder on a volume every "
            f"pod mounts (deploy/k8s/values.yaml mounts one at /data and sets {SHARED_ARTIFACTS_ROOT})"
        )


def k8s_definitions(base: dg.Definitions) -> dg.Definitions:
    """`base` with the Kubernetes step executor, GPU requests on the `gpu` pool's steps, and fanned-out
    probes; its warehouse and artifacts must be on shared storage (`check_shared_storage`)."""
    check_shared_storage(base.resources or {})
    return dg.Definitions(
        assets=[_k8s_asset(asset) for asset in base.assets or []],
        asset_checks=base.asset_checks,
        jobs=base.jobs,
        schedules=base.schedules,
        sensors=base.sensors,
        resources=base.resources,
        loggers=base.loggers,
        metadata=base.metadata,
        executor=k8s_executor(),
    )


def profile_from_env(base: dg.Definitions) -> dg.Definitions:
    """The Definitions for the profile named by $CORYPHAEUS_PROFILE (unset or `local`: `base` as is)."""
    profile = os.environ.get(PROFILE_ENV, "local")
    if profile == "local":
        return base
    if profile == K8S_PROFILE:
        return k8s_definitions(base)
    raise ValueError(f"${PROFILE_ENV}={profile!r}: expected 'local' or {K8S_PROFILE!r}")


# ---------------------------------------------------------------------- run tags


def git_commit() -> str:
    """$CORYPHAEUS_GIT_COMMIT, else the checkout's short commit (`+dirty` with uncommitted tracked
    changes), else `unknown` (no git, no checkout)."""
    if os.environ.get(GIT_COMMIT_ENV):
        return os.environ[GIT_COMMIT_ENV]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}+dirty" if dirty else commit


# The run tags of a seed run of a recipe (`python -m assets.main --seed N`, `make seeds`): which
# trainer seed and which recipe (the trainer profile and the settings file's name) made it.
SEED_TAG, RECIPE_TAG = "seed", "recipe"
# The recipe a run's training is: its recipe, or the profile alone when its settings file sets only how
# the eval runs (`RunSettings.trained_recipe`), so such an eval reads the checkpoint the profile trained.
TRAINED_RECIPE_TAG = "trained_recipe"
# An eval run of the trained conductor alone (`assets.evaluate_checkpoint --quick`): printed, but
# not a seed's record, which pairs the conductor with its warm start and shuffled twin.
QUICK_EVAL_TAG = "quick_eval"


def trained_recipe(tags: Mapping[str, str]) -> str | None:
    """The recipe whose training a run with `tags` ran or reads (runs before the tag: their recipe)."""
    return tags.get(TRAINED_RECIPE_TAG, tags.get(RECIPE_TAG))


def trained_otherwise(tags: Mapping[str, str]) -> Callable[[Mapping[str, str]], bool]:
    """Whether a run (by its tags) trained another recipe than the one a run with `tags` trains or
    reads: what a reader of that run's gate, warm start or checkpoint passes over. A run without a
    recipe tag passes over none."""
    wanted = trained_recipe(tags)
    return lambda run_tags: wanted is not None and trained_recipe(run_tags) != wanted


def run_tags(pool: str) -> dict[str, str]:
    """What tells two runs apart in the UI's run list: the pool, the code's commit, the profile, and
    the CPU whose float kernels computed it (`cpu_signature`)."""
    return {
        "pool": pool, "git_commit": git_commit(), "profile": os.environ.get(PROFILE_ENV) or "local",
        "cpu": cpu_signature(),
    }


def with_job_tags(jobs: Sequence[Any], tags: Mapping[str, str]) -> list[Any]:
    """Copies of asset jobs whose runs carry `tags` (later keys win over a job's own tags).

    Dagster has no public way to re-tag an existing job, so each is declared again from its parts.
    """
    return [
        dg.define_asset_job(
            job.name, selection=job.selection, config=job.config, description=job.description,
            tags={**job.tags, **tags}, run_tags={**job.run_tags, **tags} if job.run_tags else None,
            partitions_def=job.partitions_def, executor_def=job.executor_def, hooks=job.hooks,
            op_retry_policy=job.op_retry_policy,
        )
        for job in jobs
    ]
