"""The one Definitions object: every stage's assets, checks, jobs and schedules, and the resources."""

from __future__ import annotations

import dagster as dg

from assets import corpora, evaluation, probing, training, world_model
from assets.deployment import profile_from_env
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.trainer import TrainerResource
from resources.warehouse import WarehouseResource

STAGE_MODULES = [corpora, probing, training, world_model, evaluation]

# The headless main run (`make run`) executes these in order; the UI can run any of them too.
corpora_job = dg.define_asset_job(
    "corpora_job", selection=dg.AssetSelection.groups(corpora.GROUP), description="Load and validate the corpora"
)
probe_job = dg.define_asset_job(
    "probe_job",
    selection=dg.AssetSelection.assets(probing.probe_calls),
    description="Probe every worker of the pool (one run over all worker partitions)",
)
analysis_job = dg.define_asset_job(
    "analysis_job",
    selection=dg.AssetSelection.all()
    - dg.AssetSelection.groups(corpora.GROUP, evaluation.GROUP)
    - dg.AssetSelection.assets(probing.probe_calls),
    description="Downstream of the probes: pass rates, ceilings, contested set, gate, training, world model",
)
# Evaluation reads the latest checkpoint from the event log rather than depending on it (a closed
# gate must not block evaluating the workers and baselines), so it runs after training finishes.
eval_job = dg.define_asset_job(
    "eval_job", selection=dg.AssetSelection.groups(evaluation.GROUP), description="Eval arms and tables"
)
MAIN_JOBS = [corpora_job, probe_job, analysis_job, eval_job]

# CORYPHAEUS_PROFILE=k8s swaps in the Kubernetes executor and GPU requests (assets/deployment.py).
defs = profile_from_env(
    dg.Definitions(
        assets=dg.load_assets_from_modules(STAGE_MODULES),
        asset_checks=dg.load_asset_checks_from_modules(STAGE_MODULES),
        jobs=[*MAIN_JOBS, *probing.PROBING_JOBS, *training.TRAINING_JOBS],
        schedules=probing.PROBING_SCHEDULES,
        sensors=probing.PROBING_SENSORS,
        resources={
            "warehouse": WarehouseResource(),
            "pool": PoolResource(),
            "conductor": ConductorPolicyResource(),
            "trainer": TrainerResource(),
        },
    )
)
