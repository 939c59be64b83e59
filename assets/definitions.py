"""The one Definitions object: every stage's assets, checks, jobs and schedules, and the resources."""

from __future__ import annotations

from dagster import Definitions, load_asset_checks_from_modules, load_assets_from_modules

from assets import corpora
from resources.warehouse import WarehouseResource

STAGE_MODULES = [corpora]

defs = Definitions(
    assets=load_assets_from_modules(STAGE_MODULES),
    asset_checks=load_asset_checks_from_modules(STAGE_MODULES),
    resources={"warehouse": WarehouseResource()},
)
