"""The project's Definitions: every stage's assets, checks, jobs and schedules, and the resources.

`build_definitions(pool)` builds them for one worker pool (the probe partitions are its workers).
`defs` is what `workspace.yaml`, `dagster ... -m assets.definitions` and the Kubernetes code
location load: Dagster calls it when it loads the code, and it builds the definitions for the
pool named by $CORYPHAEUS_POOL in the profile named by $CORYPHAEUS_PROFILE at that moment.
Importing this module reads no setting.
"""

from __future__ import annotations

import dagster as dg

from assets import corpora, evaluation, pool_search, probing, training, world_model
from assets.deployment import profile_from_env, run_tags, with_job_tags
from assets.run_settings import RunSettings
from assets.versions import with_code_versions
from conductor_pipeline.files import file_sha256
from conductor_pipeline.pools.config import pool_path
from resources.conductor import ConductorPolicyResource
from resources.json_io import JsonIOManager
from resources.pool import PoolResource, default_pool_name
from resources.trainer import TrainerResource
from resources.vllm import VllmLauncherResource
from resources.warehouse import WarehouseResource

STAGE_MODULES = [corpora, probing, pool_search, training, world_model, evaluation]

# The headless main run (`python -m assets.main`) executes these in order; the UI can run any of them too.
corpora_job = dg.define_asset_job(
    "corpora_job", selection=dg.AssetSelection.groups(corpora.GROUP), description="Load and validate the corpora"
)
probe_job = dg.define_asset_job(
    "probe_job",
    selection=dg.AssetSelection.assets(probing.PROBE_CALLS),
    description="Probe every worker of the pool (one run over all worker partitions)",
)
analysis_job = dg.define_asset_job(
    "analysis_job",
    selection=dg.AssetSelection.all()
    - dg.AssetSelection.groups(corpora.GROUP, evaluation.GROUP)
    - dg.AssetSelection.assets(probing.PROBE_CALLS),
    description="Downstream of the probes: pass rates, ceilings, pool search, contested set, gate, training, W",
)
# Evaluation reads the latest checkpoint from the event log rather than depending on it (a closed
# gate must not block evaluating the workers and baselines), so it runs after training finishes.
eval_job = dg.define_asset_job(
    "eval_job", selection=dg.AssetSelection.groups(evaluation.GROUP), description="Eval arms and tables"
)
MAIN_JOBS = [corpora_job, probe_job, analysis_job, eval_job]


def pool_file_digest(pool: str) -> str | None:
    """The pool file's sha256 as the definitions are built (None when there is no such file: the
    first step that loads the pool says so)."""
    path = pool_path(pool)
    return file_sha256(path) if path.is_file() else None


def build_definitions(pool: str, settings: RunSettings | None = None) -> dg.Definitions:
    """Every stage for worker pool `pool` (a name under data/pools/ or a pool file), local profile,
    with the resource and op settings of `settings` (a `--config` file; None: the defaults).
    The main and training jobs' runs carry the pool, the code's commit and the profile as tags (the
    re-probe job is left as the schedule that targets it declares it). Every asset carries its code
    version (assets/versions.py), so Dagster tells which are stale."""
    settings = settings or RunSettings()
    pool_probing = probing.pool_probing_definitions(pool)
    # Serves the pool's `vllm` seats for the steps that call them; configurable per run (`resources.vllm`).
    vllm = VllmLauncherResource.configure_at_launch()
    resources = {
        "warehouse": WarehouseResource(**settings.resource("warehouse")),
        "vllm": vllm,
        "pool": PoolResource(pool=pool, vllm=vllm, pool_sha256=pool_file_digest(pool)),
        "conductor": ConductorPolicyResource(**settings.resource("conductor")),
        "trainer": TrainerResource(**settings.resource("trainer")),
        # Outputs passed between assets (eval_arms -> eval_tables) are kept on disk, not in memory, so
        # a stale eval_tables can be recomputed alone from a fresh eval_arms; as JSON, never pickles.
        "io_manager": JsonIOManager(),
    }
    return dg.Definitions(
        assets=with_code_versions(
            [pool_probing.probe_calls, *dg.load_assets_from_modules(STAGE_MODULES)], resources, settings.ops
        ),
        asset_checks=dg.load_asset_checks_from_modules(STAGE_MODULES),
        jobs=[*with_job_tags([*MAIN_JOBS, *training.TRAINING_JOBS], run_tags(pool)), *probing.PROBING_JOBS],
        schedules=[pool_probing.reprobe_schedule],
        sensors=probing.PROBING_SENSORS,
        resources=resources,
    )


def definitions_for(pool: str, settings: RunSettings | None = None) -> dg.Definitions:
    """`build_definitions(pool, settings)` in the deployment profile named by $CORYPHAEUS_PROFILE
    (`k8s`: the Kubernetes executor and GPU requests, see assets/deployment.py)."""
    return profile_from_env(build_definitions(pool, settings))


@dg.definitions
def defs() -> dg.Definitions:
    """The definitions Dagster loads: for the pool named by $CORYPHAEUS_POOL (else the default pool)."""
    return definitions_for(default_pool_name())
