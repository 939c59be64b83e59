"""How much of a pytest process's time goes to Python's garbage collector: a pytest plugin.

    GC_TIMING_LOG=/tmp/gc.log .venv/bin/python -m pytest -n 2 -p benchmarks.gc_timing   # the suite, per worker
    GC_TIMING_FREEZE=1 .venv/bin/python -m pytest -p no:xdist -p benchmarks.gc_timing tests/assets/test_training_assets.py

Every collection, automatic or explicit, is timed through `gc.callbacks`; when the process ends it
prints (and appends to $GC_TIMING_LOG, when set) how many collections ran, their seconds, and how
many of them were full (generation 2) collections. Under xdist the workers' prints are not shown:
set GC_TIMING_LOG. With GC_TIMING_FREEZE=1 each process imports the
heavy libraries first and calls `gc.freeze()`, so their objects are left out of every collection:
the comparison says what freezing would save. Subprocesses that tests start are not counted. The
figures of 2026-12-07 are in docs/LOG.md ("eighth").
"""

from __future__ import annotations

import gc
import importlib
import os
import time

import pytest

# What most test processes import anyway; frozen after import with GC_TIMING_FREEZE=1.
HEAVY_LIBRARIES = ("torch", "transformers", "trl", "dagster", "polars", "duckdb")

_totals = {"collections": 0, "seconds": 0.0, "full": 0, "full_seconds": 0.0}
_started = {"at": 0.0, "process": time.perf_counter()}


def _time_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _started["at"] = time.perf_counter()
        return
    elapsed = time.perf_counter() - _started["at"]
    _totals["collections"] += 1
    _totals["seconds"] += elapsed
    if info["generation"] == 2:
        _totals["full"] += 1
        _totals["full_seconds"] += elapsed


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("GC_TIMING_FREEZE") == "1":
        for name in HEAVY_LIBRARIES:
            importlib.import_module(name)
        gc.freeze()
    gc.callbacks.append(_time_collection)


def pytest_unconfigure(config: pytest.Config) -> None:
    gc.callbacks.remove(_time_collection)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = (
        f"gc_timing {worker} (pid {os.getpid()}, freeze {os.environ.get('GC_TIMING_FREEZE') == '1'}): "
        f"{_totals['collections']} collections in {_totals['seconds']:.2f} s, of which {_totals['full']} full "
        f"in {_totals['full_seconds']:.2f} s; process {time.perf_counter() - _started['process']:.0f} s"
    )
    print(line)
    if os.environ.get("GC_TIMING_LOG"):
        with open(os.environ["GC_TIMING_LOG"], "a", encoding="utf-8") as log:
            log.write(line + "\n")
