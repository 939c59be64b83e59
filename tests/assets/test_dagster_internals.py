"""The Dagster internals the project plans runs with are the ones it was written against: an
upgrade of Dagster fails here first, by name, before a run plans on a changed internal."""

from __future__ import annotations

import inspect

import dagster as dg

from assets import dagster_internals
from assets.dagster_internals import WRITTEN_FOR_DAGSTER, StaleStatus


def test_the_installed_dagster_is_the_release_the_internals_were_written_for():
    assert dg.__version__ == WRITTEN_FOR_DAGSTER, (
        f"assets/dagster_internals.py uses Dagster {WRITTEN_FOR_DAGSTER} internals (CachingStaleStatusResolver, "
        f"AssetGraphView, TemporalContext, AssetCheckExecutionRecordStatus, dagster._time), but Dagster "
        f"{dg.__version__} is installed: re-read them in the new release's source, then update WRITTEN_FOR_DAGSTER"
    )


def test_the_internals_have_the_shape_the_module_uses():
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    assert {"MISSING", "STALE", "FRESH"} <= set(StaleStatus.__members__)
    assert {"SUCCEEDED", "FAILED"} <= set(AssetCheckExecutionRecordStatus.__members__)
    assert {"temporal_context", "instance", "asset_graph"} <= set(inspect.signature(AssetGraphView.__init__).parameters)
    assert TemporalContext(effective_dt=dagster_internals.get_current_datetime(), last_event_id=None).last_event_id is None
    resolver = inspect.signature(dagster_internals.CachingStaleStatusResolver.__init__).parameters
    assert {"instance", "asset_graph", "loading_context"} <= set(resolver)
    for method in ("get_status", "get_stale_causes"):
        assert callable(getattr(dagster_internals.CachingStaleStatusResolver, method, None)), method


def test_the_resolver_answers_over_definitions():
    @dg.asset
    def one() -> int:
        return 1

    defs = dg.Definitions(assets=[one])
    with dg.DagsterInstance.ephemeral() as instance:
        resolver = dagster_internals.stale_status_resolver(defs, instance)
        assert resolver.get_status(dg.AssetKey("one")) == StaleStatus.MISSING
        assert dg.materialize([one], instance=instance).success
        assert dagster_internals.stale_status_resolver(defs, instance).get_status(dg.AssetKey("one")) == StaleStatus.FRESH
