"""The refresh sensor: a new probe materialization leads to one run of pass_rates and oracle_ceilings.

Evaluated with Dagster's own automation-condition tester over the project's definitions and the
sensor's target, tick after tick, as the running sensor would.
"""

import dagster as dg
from dagster._core.definitions.automation_tick_evaluation_context import build_run_requests

from assets.definitions import build_definitions
from assets.probing import PROBE_CALLS, probing_automation_sensor
from resources.pool import DEFAULT_POOL

REFRESHED = {dg.AssetKey("pass_rates"), dg.AssetKey("oracle_ceilings")}


def test_a_new_probe_materialization_requests_pass_rates_and_oracle_ceilings() -> None:
    defs = build_definitions(DEFAULT_POOL)
    workers = defs.get_assets_def(PROBE_CALLS).partitions_def.get_partition_keys()
    assert probing_automation_sensor.default_status == dg.DefaultSensorStatus.RUNNING
    with dg.DagsterInstance.ephemeral() as instance:

        def tick(cursor=None) -> dg.EvaluateAutomationConditionsResult:
            return dg.evaluate_automation_conditions(
                defs, instance, asset_selection=probing_automation_sensor.asset_selection, cursor=cursor
            )

        def materialized(key: str, partitions=(None,)) -> None:
            for partition in partitions:
                instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=partition))

        materialized(PROBE_CALLS, workers)  # a finished first run: probes, then what reads them
        materialized("pass_rates")
        materialized("oracle_ceilings")
        result = tick()
        result = tick(result.cursor)
        assert result.total_requested == 0  # everything is up to date

        materialized(PROBE_CALLS, workers)  # the re-probe schedule's run lands
        result = tick(result.cursor)
        assert {key: result.get_num_requested(key) for key in REFRESHED} == dict.fromkeys(REFRESHED, 1)
        requests = build_run_requests(
            [r.true_subset for r in result.results if not r.true_subset.is_empty], defs.resolve_asset_graph(),
            run_tags=None, emit_backfills=False,
        )
        assert [set(request.asset_selection) for request in requests] == [REFRESHED]  # one run refreshes both

        materialized("pass_rates")
        materialized("oracle_ceilings")
        assert tick(result.cursor).total_requested == 0  # refreshed once, not again
