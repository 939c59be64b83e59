"""Rollouts as telemetry: every sampled workflow of a training run lands in `workflows` and `calls`.

Every rollout (the warm start's parse checks, the probe, the pruning audit, GRPO) is executed by
the orchestrator exactly like an evaluation workflow, so the routing dataset is a by-product of
training: a `workflows` row per rollout (tagged with its phase, optimizer step and position in
the step's batch) and `calls` rows for the conductor's completion and every executed worker step.
Keys are stable (`rollout_workflow_id`), so a repeated run adds nothing twice, and a resumed run
first forgets the rollouts it logged past its last checkpoint (`forget_rollouts_after`).

Why rows are held in memory between checkpoints: a warehouse write takes the inter-process lock
and opens the DuckDB file (tens of milliseconds, more on a busy machine), about a tenth of a CPU
step of the tiny model when paid every step. `RowBuffer` writes when a checkpoint is about to be
saved, when a run ends, or when it holds `flush_rows` rows. A run killed in between loses only
rows of steps after its last checkpoint, which the resumed run forgets and samples again anyway.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from conductor_pipeline.records import RolloutTag, stable_id
from conductor_pipeline.warehouse import Warehouse

# Phases of the rollouts a training chain samples (workflows.phase).
PARSE_CHECK_BEFORE = "parse_check_before"
PARSE_CHECK_AFTER = "parse_check_after"
PRUNE_AUDIT = "prune_audit"
# Write once this many rows are held: about four steps of the paper's GPU run (256 rollouts a
# step, each a workflow, a conductor call and a few step calls), a whole CPU run of the tiny model.
DEFAULT_FLUSH_ROWS = 4000
# Calls before workflows: a recorded workflow always has its calls.
_WRITE_ORDER = ("calls", "workflows")


class RowBuffer:
    """Warehouse rows held in memory and written in a few large batches.

    `insert` and `insert_tables` have `Warehouse`'s signatures, so an orchestrator records through
    it unchanged; it writes only once `flush_rows` rows are held. `flush` writes everything held
    (calls before workflows). Thread-safe: TRL runs the reward, and so the orchestrator, on its own
    threads.
    """

    def __init__(self, store: Warehouse, *, flush_rows: int = DEFAULT_FLUSH_ROWS) -> None:
        self.store = store
        self.flush_rows = flush_rows
        self._held: dict[str, list[Any]] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> RowBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Everything held is written when the block ends, however it ends (a step's rollouts)."""
        self.flush()

    def insert(self, table: str, rows: Iterable[Any]) -> int:
        return self.insert_tables({table: rows})[table]

    def insert_tables(self, batches: Mapping[str, Iterable[Any]]) -> dict[str, int]:
        held_now = {table: list(rows) for table, rows in batches.items()}
        with self._lock:
            for table, batch in held_now.items():
                self._held.setdefault(table, []).extend(batch)
            full = sum(len(held) for held in self._held.values()) >= self.flush_rows
        if full:
            self.flush()
        return {table: len(batch) for table, batch in held_now.items()}

    def flush(self) -> None:
        """Write everything held in one warehouse transaction, calls before workflows."""
        with self._lock:
            held, self._held = self._held, {}
            tables = [t for t in _WRITE_ORDER if t in held] + [t for t in held if t not in _WRITE_ORDER]
            if tables:
                self.store.insert_tables({table: held[table] for table in tables})


@dataclass
class RolloutLog:
    """Where the rollouts of one run go: the buffer, the run id and phase they are filed under, and
    the policy's name in `workflows.conductor`."""

    buffer: RowBuffer
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
    store.execute_files(["delete_rollout_calls_after", "delete_rollouts_after"], {"run_id": run_id, "step": step})


def forget_run(store: Warehouse, run_id: str) -> None:
    """Delete every row a run logged (calls, workflows, training steps), in one transaction: a run
    whose id says what it computes (`rollout_run_id`) starts clean when it is repeated, so an
    interrupted attempt leaves nothing behind that the complete one would not have written."""
    store.execute_files(["delete_run_calls", "delete_run_workflows", "delete_run_training_steps"], {"run_id": run_id})


def rollout_run_id(kind: str, pool: str, *inputs: object) -> str:
    """A rollout run's id from what decides its rollouts (`inputs`: code version, policy weights,
    questions), not from the Dagster run that computes it: a rerun after a kill is the same run."""
    return f"{kind}-{pool}-{stable_id(kind, pool, *inputs)[:8]}"


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


def fan_out_counts(store: Warehouse, run_id: str, aggregators: Collection[str]) -> pl.DataFrame | None:
    """Per optimizer step: its rollouts (infrastructure failures left out) and how many fanned out
    to several workers and aggregated them (`sql/workflow_fan_out.sql`) with one of `aggregators`
    (the pool's vote seats); None when the pool has no aggregator."""
    if not aggregators:
        return None
    flags = store.query_file("workflow_fan_out", {"run_id": run_id, "aggregators": sorted(aggregators)})
    return (
        flags.filter(pl.col("step").is_not_null() & ~pl.col("infra_failure").fill_null(False))
        .group_by("step")
        .agg(pl.len().alias("rollouts"), pl.col("fans_out").sum().alias("fan_out"))
        .sort("step")
    )
