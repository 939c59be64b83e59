"""Runs whose process is gone, and the concurrency slots they still hold.

A headless run (`python -m assets.main`, `dagster asset materialize`) executes in its own process
with no daemon watching it. Killed (SIGKILL, an OOM killer, a laptop that sleeps through it, an
evicted pod), it leaves its Dagster run STARTED for good and its steps' concurrency slots claimed,
and every later step in that pool waits for them. So before it plans anything, `make run` asks
the instance for its unfinished runs, finds each one's process (the PID, host and start time this
project tags its runs with; for runs started elsewhere, the PID Dagster records with the run's
start event, on an instance stored on this machine), marks the run failed with a reason naming the
dead process (`DagsterInstance.report_run_failed`) and frees its slots (the event log storage's
`free_concurrency_slots_for_run`, what the UI's "free slots" button calls). A step that waits for
a slot says every few seconds who holds it and how to release it (`SlotWaitMonitor`).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import dagster as dg

from conductor_pipeline.locks import ProcessIdentity, identity_is_alive

# Tags every run of `make run` carries: which process executes it.
PID_TAG = "coryphaeus/pid"
HOST_TAG = "coryphaeus/host"
PROCESS_STARTED_TAG = "coryphaeus/process_started_at"
UNFINISHED = [
    dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
# How often a step waiting for a slot says so.
SLOT_WAIT_LOG_EVERY_S = 5.0


def process_tags(identity: ProcessIdentity | None = None) -> dict[str, str]:
    """The tags that let a later process tell whether this one still runs the run."""
    identity = identity or ProcessIdentity.current()
    return {PID_TAG: str(identity.pid), HOST_TAG: identity.host, PROCESS_STARTED_TAG: repr(identity.started_at)}


def _storage_is_local(instance: dg.DagsterInstance) -> bool:
    """Whether the instance's runs are stored on this machine (SQLite under DAGSTER_HOME), so an
    untagged run's recorded PID is one of this machine's processes."""
    return type(instance.run_storage).__name__.startswith("Sqlite")


def run_process(instance: dg.DagsterInstance, run: dg.DagsterRun) -> ProcessIdentity | None:
    """The process that executes `run`: from this project's tags, else the PID of Dagster's own
    run-start event (local instances only); None when it cannot be known."""
    tags = run.tags
    if PID_TAG in tags:
        return ProcessIdentity(int(tags[PID_TAG]), tags.get(HOST_TAG, ""), float(tags[PROCESS_STARTED_TAG]),
                               f"the run {run.run_id[:8]} ({run.job_name})")
    if not _storage_is_local(instance):
        return None
    records = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.RUN_START, limit=1).records
    if not records:
        return None
    entry = records[0].event_log_entry
    pid = entry.dagster_event.pid if entry.dagster_event is not None else None
    if pid is None:
        return None
    return ProcessIdentity(int(pid), socket.gethostname(), entry.timestamp, f"the run {run.run_id[:8]} ({run.job_name})")


def claimed_slots(instance: dg.DagsterInstance, run_id: str | None = None) -> dict[str, list[tuple[str, str]]]:
    """Per concurrency pool, the (run id, step) pairs holding a slot (only `run_id`'s, if given)."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return {}
    held: dict[str, list[tuple[str, str]]] = {}
    for pool in sorted(storage.get_concurrency_keys()):
        slots = [(s.run_id, s.step_key) for s in storage.get_concurrency_info(pool).claimed_slots]
        slots = [slot for slot in slots if run_id is None or slot[0] == run_id]
        if slots:
            held[pool] = slots
    return held


def _free(instance: dg.DagsterInstance, run_id: str) -> str:
    """Free every slot `run_id` holds or waits for; says which were held."""
    held = claimed_slots(instance, run_id)
    if instance.event_log_storage.supports_global_concurrency_limits:
        instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    return ", ".join(f"{pool} ({step})" for pool, slots in held.items() for _, step in slots) or "none"


def reap_run(instance: dg.DagsterInstance, run: dg.DagsterRun, identity: ProcessIdentity, out: Callable[[str], object]) -> None:
    """Mark a run whose process is gone as failed (the reason names the process) and free its slots."""
    freed = _free(instance, run.run_id)
    instance.report_run_failed(
        run,
        f"Marked failed by `python -m assets.main` (PID {os.getpid()}): this run was {run.status.value}, but "
        f"the process executing it, PID {identity.pid} on {identity.host or 'this host'}, is gone (killed, or "
        f"the machine slept or restarted), so it can never finish. Concurrency slots freed: {freed}.",
    )
    out(f"   run {run.run_id} ({run.job_name}) was {run.status.value} but its process PID {identity.pid} is gone: "
        f"marked failed, slots freed: {freed}")


def reap_dead_runs(instance: dg.DagsterInstance, out: Callable[[str], object] = print) -> list[str]:
    """Fail every unfinished run of the instance whose process is gone and free its slots; free
    the slots finished runs still hold. Returns the ids of the runs marked failed."""
    reaped = []
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=UNFINISHED)):
        run = record.dagster_run
        identity = run_process(instance, run)
        if identity is None or identity_is_alive(identity):
            continue
        reap_run(instance, run, identity, out)
        reaped.append(run.run_id)
    storage = instance.event_log_storage
    holders = storage.get_concurrency_run_ids() if storage.supports_global_concurrency_limits else set()
    if holders:
        for record in instance.get_run_records(filters=dg.RunsFilter(run_ids=list(holders), statuses=FINISHED)):
            freed = _free(instance, record.dagster_run.run_id)
            out(f"   run {record.dagster_run.run_id} is {record.dagster_run.status.value} but still held "
                f"concurrency slots: freed {freed}")
    return reaped


# --- a step that waits for a slot -------------------------------------------------------------------


def describe_holder(instance: dg.DagsterInstance, run_id: str, step: str) -> tuple[str, ProcessIdentity | None, bool]:
    """(a sentence about the run holding a slot and how to release it, its process, whether alive)."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        return f"run {run_id} (no longer in this instance: the slot is freed now)", None, False
    identity = run_process(instance, run)
    alive = identity is None or identity_is_alive(identity)
    if identity is None:
        how = f"it is released when that run ends; to stop it: `dagster run delete {run_id}` or the UI's Runs page"
    elif alive:
        how = f"it is released when that step ends; to stop that run now: `kill -TERM {identity.pid}`"
    else:
        how = "its process is gone, so this run frees the slot now"
    pid = f", PID {identity.pid}" if identity else ""
    return f"run {run_id} ({run.job_name}, step {step}{pid}); {how}", identity, alive


def sigterm_as_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C (install with `signal.signal`): outside a running step it stops the process
    where it is (Dagster turns both into an interrupted step while one runs)."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


@dataclass
class SlotWaitMonitor:
    """While a run executes in this process: every few seconds a step of it waits for a slot, say
    which run holds the slot and how to release it, and free it when the holder's process is gone.

    It also sees SIGINT and SIGTERM (through `signal.set_wakeup_fd`, whatever handler Dagster has
    installed): Dagster stops a running step on them, but a step still waiting for a slot would wait
    on, so then the run is marked failed, what it waited for is freed, and the process exits.
    `signal` is the signal received, if any, for the caller to stop after the run.
    """

    instance: dg.DagsterInstance
    run_id: str
    out: Callable[[str], object]
    every_s: float = SLOT_WAIT_LOG_EVERY_S
    signal: int | None = None

    def _waiting_steps(self) -> dict[str, list[str]]:
        storage = self.instance.event_log_storage
        if not storage.supports_global_concurrency_limits:
            return {}
        waiting: dict[str, list[str]] = {}
        for pool in storage.get_concurrency_keys():
            info = storage.get_concurrency_info(pool)
            steps = [p.step_key for p in info.pending_steps if p.run_id == self.run_id and p.assigned_timestamp is None]
            if steps and not any(s.run_id == self.run_id and s.step_key in steps for s in info.claimed_slots):
                waiting[pool] = steps
        return waiting

    def check(self, waited_s: float) -> None:
        """One look: report (and, for a dead holder, free) every slot a waiting step of this run needs."""
        for pool, steps in self._waiting_steps().items():
            for holder_run, holder_step in claimed_slots(self.instance).get(pool, []):
                sentence, identity, alive = describe_holder(self.instance, holder_run, holder_step)
                self.out(f"   step {', '.join(steps)} has waited {waited_s:.0f}s for a slot of pool {pool!r}, held by "
                         f"{sentence}")
                run = self.instance.get_run_by_id(holder_run)
                if not alive and identity is not None and run is not None:
                    reap_run(self.instance, run, identity, self.out)

    def _interrupted(self, signum: int) -> None:
        self.signal = signum
        waiting = self._waiting_steps()
        if not waiting:
            return  # Dagster interrupts the step that runs; the caller stops after the run
        steps = ", ".join(step for steps in waiting.values() for step in steps)
        run = self.instance.get_run_by_id(self.run_id)
        if run is not None:
            self.instance.report_run_failed(
                run, f"Interrupted by {signal.Signals(signum).name} while step {steps} waited for a concurrency slot "
                     "(nothing of this run was executing); its slots were freed.",
            )
        self.out(f"interrupted by {signal.Signals(signum).name} while {steps} waited for a slot: run {self.run_id} "
                 "marked failed, its slots freed; rerun to resume")
        self._free_until_clear()
        os._exit(128 + signum)  # Dagster's wait loop never returns to a point where it could stop

    def _free_until_clear(self, attempts: int = 20) -> None:
        """Free this run's slots and queue entries, and again while any come back: the main thread's
        wait loop, still running, re-queues a waiting step on its next try. Last before exiting, so
        the window in which it could do so once more is as short as it can be."""
        storage = self.instance.event_log_storage
        for _ in range(attempts):
            storage.free_concurrency_slots_for_run(self.run_id)
            time.sleep(0.05)
            queued = [p for pool in storage.get_concurrency_keys()
                      for p in storage.get_concurrency_info(pool).pending_steps if p.run_id == self.run_id]
            if not queued and not claimed_slots(self.instance, self.run_id):
                storage.free_concurrency_slots_for_run(self.run_id)
                return

    def _watch(self, wakeup: int, stop: threading.Event) -> None:
        started = time.monotonic()
        while not stop.is_set():
            ready, _, _ = select.select([wakeup], [], [], self.every_s)
            if stop.is_set():
                return
            if ready:
                for byte in os.read(wakeup, 64):
                    if byte in (signal.SIGINT, signal.SIGTERM):
                        self._interrupted(byte)
                continue
            self.check(time.monotonic() - started)

    @contextmanager
    def watching(self) -> Iterator[SlotWaitMonitor]:
        """Watch for the duration of the block. Signals are seen only from the main thread (where
        Python runs signal handlers and the wakeup fd can be set); elsewhere slots are still watched."""
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        on_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False) if on_main_thread else None
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(read_end, stop), name="slot-wait-monitor", daemon=True)
        watcher.start()
        try:
            yield self
        finally:
            stop.set()
            if on_main_thread:
                signal.set_wakeup_fd(previous)
            os.write(write_end, b"\0")  # wake the watcher so it sees `stop`
            watcher.join(timeout=5)
            os.set_blocking(read_end, False)
            try:  # a signal the watcher had no time to read still stops the caller
                late = os.read(read_end, 64)
            except BlockingIOError:
                late = b""
            self.signal = self.signal or next((b for b in late if b in (signal.SIGINT, signal.SIGTERM)), None)
            os.close(read_end)
            os.close(write_end)
