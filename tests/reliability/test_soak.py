"""Soak: >= 5,000 calls (a probe, then workflows) at 20% faults of every kind; every call accounted for.

Slow (about a minute on two cores): runs with RUN_SLOW=1. The same function backs
`benchmarks/soak.py`, which records the figures in benchmarks/RESULTS-reliability.md.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest

from benchmarks.soak import ALL_FAULT_KINDS, run_soak

pytestmark = pytest.mark.slow


def test_soak_at_twenty_percent_faults_loses_and_duplicates_nothing(tmp_path) -> None:
    figures = run_soak(tmp_path, n_questions=600, n_workflows=1100)
    print("\n" + figures.table())
    print(asdict(figures))

    assert figures.calls_issued >= 5_000
    # Rows in the warehouse = calls the pipeline made; none lost, none written twice.
    assert figures.rows_calls == figures.calls_issued
    assert figures.lost == 0 and figures.duplicated == 0 and figures.missing_probe_keys == 0
    assert figures.rows_workflows == figures.workflows
    # Every fault kind was served, transient ones were retried, and whatever stayed transient was excluded.
    assert all(figures.served.get(kind.value, 0) > 0 for kind in ALL_FAULT_KINDS)
    assert figures.retries > 0 and figures.calls_retried > 0
    assert figures.scored + figures.excluded == figures.rows_calls
    assert figures.excluded == figures.status_counts.get("transient", 0)
    # The server saw at most one request per attempt (an attempt that never connected is not seen).
    assert figures.attempts_sent <= figures.calls_issued + figures.retries
    # Final statuses reconcile with what the server answered (a served answer ends its call).
    assert figures.status_counts.get("ok", 0) == figures.served["ok"]
    assert figures.status_counts.get("empty", 0) == figures.served["reasoning_only"]
    assert figures.status_counts.get("terminal", 0) == figures.served["bad_request"]
    assert figures.status_counts.get("truncated", 0) == figures.served["truncated"]
