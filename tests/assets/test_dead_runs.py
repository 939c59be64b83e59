"""`assets/dead_runs.py` is the one module that reaches into Dagster's storage APIs (the concurrency
slots and the run-start event's PID). They are not part of Dagster's documented surface, so this
test pins the version they were checked on and the calls the module makes: on another Dagster it
fails loudly, naming what to re-check, instead of letting a hang come back quietly."""

from __future__ import annotations

import inspect

import dagster as dg
from dagster._core.storage.event_log.base import EventLogStorage
from dagster._utils.concurrency import ClaimedSlotInfo, PendingStepInfo

CHECKED_ON = "1.13.27"
STORAGE_CALLS = (
    "supports_global_concurrency_limits", "get_concurrency_keys", "get_concurrency_info", "get_concurrency_run_ids",
    "free_concurrency_slots_for_run",
)


def test_the_dagster_storage_calls_dead_runs_makes_exist_on_the_pinned_version() -> None:
    assert dg.__version__ == CHECKED_ON, (
        f"Dagster {dg.__version__}, not {CHECKED_ON}: re-check assets/dead_runs.py (concurrency slot storage calls, "
        "DagsterEvent.pid of RUN_START, report_run_failed) and the in-process executor's slot wait loop, then update "
        "CHECKED_ON"
    )
    for name in STORAGE_CALLS:
        assert hasattr(EventLogStorage, name), name
    assert list(inspect.signature(dg.DagsterInstance.report_run_failed).parameters)[:3] == ["self", "dagster_run", "message"]
    assert "pid" in inspect.signature(dg.DagsterEvent).parameters
    assert {"run_id", "step_key", "assigned_timestamp"} <= set(PendingStepInfo.__annotations__)
    assert {"run_id", "step_key"} <= set(ClaimedSlotInfo.__annotations__)
