"""The one Definitions object: every stage's assets, checks, jobs and schedules, and the resources."""

from __future__ import annotations

import dagster as dg

from assets import corpora, evaluation, probing
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource

STAGE_MODULES = [corpora, probing, evaluation]

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
    - dg.AssetSelection.groups(corpora.GROUP)
    - dg.AssetSelection.assets(probing.probe_calls),
    description="Everything downstream of the probes: pass rates, ceilings, gates, training, evaluation",
)
MAIN_JOBS = [corpora_job, probe_job, analysis_job]

defs = dg.Definitions(
    assets=dg.load_assets_from_modules(STAGE_MODULES),
    asset_checks=dg.load_asset_checks_from_modules(STAGE_MODULES),
    jobs=[*MAIN_JOBS, *probing.PROBING_JOBS],
    schedules=probing.PROBING_SCHEDULES,
    sensors=probing.PROBING_SENSORS,
    resources={
        "warehouse": WarehouseResource(),
        "pool": PoolResource(),
        "conductor": ConductorPolicyResource(),
    },
)
