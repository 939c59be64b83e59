"""Every Dagster internal the project uses, in one place: Dagster 1.13 has no public API for them.

`assets/main.py` plans a headless run the way the UI would, by each asset's MISSING / STALE / FRESH
status (Dagster's `CachingStaleStatusResolver` over an `AssetGraphView` at the current time), and
reads whether a blocking check finished or failed (`AssetCheckExecutionRecordStatus` of the check's
latest execution record). None of these is exported by `dagster`; they are imported here and
nowhere else, and `tests/assets/test_dagster_internals.py` fails, naming both versions, when the
installed Dagster is not the release this module was written for.
"""

from __future__ import annotations

import dagster as dg
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleCause, StaleStatus
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._time import get_current_datetime

# The Dagster release these internals were read from (pyproject.toml pins it).
WRITTEN_FOR_DAGSTER = "1.13.27"

__all__ = [
    "WRITTEN_FOR_DAGSTER",
    "CachingStaleStatusResolver",
    "StaleCause",
    "StaleStatus",
    "check_execution_failed",
    "check_execution_finished",
    "stale_status_resolver",
]


def stale_status_resolver(defs: dg.Definitions, instance: dg.DagsterInstance) -> CachingStaleStatusResolver:
    """Dagster's resolver of MISSING / STALE / FRESH, the one the UI asks, over these definitions."""
    asset_graph = defs.resolve_asset_graph()
    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
        instance=instance,
        asset_graph=asset_graph,
    )
    return CachingStaleStatusResolver(instance=instance, asset_graph=asset_graph, loading_context=view)


def check_execution_failed(execution) -> bool:
    """Whether an asset check execution record (the event log's latest for its check) failed."""
    return execution.status == AssetCheckExecutionRecordStatus.FAILED


def check_execution_finished(execution) -> bool:
    """Whether an asset check execution record has a verdict (succeeded or failed), not still planned
    or cut short."""
    return execution.status in (AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED)
