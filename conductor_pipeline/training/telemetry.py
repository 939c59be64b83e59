"""Rollouts as telemetry: every sampled workflow of a training run lands in `workflows` and `calls`.

Every rollout (the warm start's parse checks, the probe, the pruning audit, GRPO) is executed by
the orchestrator exactly like an evaluation workflow, so the routing dataset is a by-product of
training: a `workflows` row per rollout (tagged with its phase, optimizer step and position in
the step's batch) and `calls` rows for the conductor's completion and every executed worker step.
Keys are stable (`rollout_workflow_id`), so a repeated run adds nothing twice, and a resumed run
first forgets the rollouts it logged past its last checkpoint (`forget_rollouts_after`).

Why a background writer: a warehouse write takes the inter-process lock and opens the DuckDB file
(tens of milliseconds on a busy machine), which is a visible share of a CPU step of about a
second. The rows of a step are queued at the end of its reward call and written while the policy
takes its gradient step; `drain` waits for them before a checkpoint is saved and before anything
reads them back.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from conductor_pipeline.records import RolloutTag, stable_id
from conductor_pipeline.warehouse import Warehouse, load_sql

# Phases of the rollouts a training chain samples (workflows.phase).
PARSE_CHECK_BEFORE = "parse_check_before"
PARSE_CHECK_AFTER = "parse_check_after"
PRUNE_AUDIT = "prune_audit"


class TelemetryWriteError(RuntimeError):
    """A queued warehouse write failed; the training run must not go on without its telemetry."""


class BackgroundWriter:
    """Warehouse writes on one background thread, in the order they were queued.

    `insert` has `Warehouse.insert`'s signature, so an orchestrator writes through it unchanged;
    it returns at once. `drain` blocks until every queued row is written and re-raises a failed
    write as TelemetryWriteError (after a failure nothing more is written: rows must not land out
    of order, e.g. a workflow without its calls).
    """

    def __init__(self, store: Warehouse) -> None:
        self.store = store
        self._queue: queue.Queue[tuple[str, list[Any]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._start_lock = threading.Lock()

    def insert(self, table: str, rows: Iterable[Any]) -> int:
        self._raise_failure()
        batch = list(rows)
        if batch:
            self._ensure_thread()
            self._queue.put((table, batch))
        return len(batch)

    def drain(self) -> None:
        """Wait until everything queued is written; raise if a write failed."""
        if self._thread is not None:
            self._queue.join()
        self._raise_failure()

    def close(self) -> None:
        """Drain, then stop the thread."""
        try:
            self.drain()
        finally:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._thread = None

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rollout-telemetry", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    self.store.insert(*item)
            except BaseException as exc:  # noqa: BLE001 (re-raised in the training thread by drain)
                self._error = exc
            finally:
                self._queue.task_done()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise TelemetryWriteError(f"writing rollout telemetry to {self.store.path} failed: {self._error!r}") from self._error


@dataclass
class RolloutLog:
    """Where the rollouts of one run go: the writer, the run id and phase they are filed under, and
    the policy's name in `workflows.conductor`."""

    writer: BackgroundWriter
    run_id: str
    phase: str
    conductor: str

    def tag(self, training_step: int | None, position: int) -> RolloutTag:
        return RolloutTag(self.phase, training_step, position)

    def workflow_id(self, tag: RolloutTag, question_id: str) -> str:
        return rollout_workflow_id(self.run_id, tag, question_id)


def rollout_workflow_id(run_id: str, tag: RolloutTag, question_id: str) -> str:
    """A rollout's stable key: its run, phase, step, place in the batch, question and training
    process (several processes each execute their own share of a batch)."""
    return stable_id("rollout", run_id, tag.phase, tag.training_step, tag.rollout, question_id, os.environ.get("RANK", "0"))


# --- reading the rollouts back ----------------------------------------------------------------


def forget_rollouts_after(store: Warehouse, run_id: str, step: int) -> None:
    """Delete a run's rollout rows (workflows and their calls) of steps after `step`: a resumed run
    samples those steps again, and the stable keys would otherwise keep the lost trajectory's rows."""
    params = {"run_id": run_id, "step": step}
    with store.connect() as con:
        con.begin()
        try:
            con.execute(load_sql("delete_rollout_calls_after"), params)
            con.execute(load_sql("delete_rollouts_after"), params)
            con.commit()
        except BaseException:
            con.rollback()
            raise


def rollout_outcome_counts(store: Warehouse, run_id: str) -> dict[int, dict[str, int]]:
    """Per optimizer step of a run: its rollouts per outcome (a parse code, or `infrastructure`),
    counted from `workflows`, in the shape of `training_steps.parse_codes`."""
    frame = store.query_file("rollout_outcomes_by_step", {"run_id": run_id})
    counts: dict[int, dict[str, int]] = {}
    for row in frame.iter_rows(named=True):
        counts.setdefault(int(row["step"]), {})[row["outcome"]] = int(row["rollouts"])
    return counts


def telemetry_mismatches(
    logged: Mapping[int, Mapping[str, int]], recorded: Mapping[int, Mapping[str, int]]
) -> dict[int, dict[str, dict[str, int]]]:
    """Steps whose outcome counts in `training_steps` (logged) differ from the `workflows` rows
    (recorded); empty when the telemetry is complete."""
    return {
        step: {"training_steps": dict(logged.get(step, {})), "workflows": dict(recorded.get(step, {}))}
        for step in sorted(set(logged) | set(recorded))
        if dict(logged.get(step, {})) != dict(recorded.get(step, {}))
    }


def rollout_row_counts(store: Warehouse, run_id: str) -> dict[str, int]:
    """How many `workflows` and `calls` rows a run's rollouts left (calls split by kind)."""
    row = store.query_file("rollout_row_counts", {"run_id": run_id}).row(0, named=True)
    return {name: int(value or 0) for name, value in row.items()}


def final_worker_counts(store: Warehouse, run_id: str) -> pl.DataFrame:
    """Per optimizer step: rollouts ending at each worker (`(unparsed)` for a workflow that did not parse)."""
    return store.query_file("rollout_final_workers", {"run_id": run_id})
