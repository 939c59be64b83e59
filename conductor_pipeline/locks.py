"""Which process holds what, whether it is still alive, and a lock that says who holds it.

A lock file on its own cannot tell a live holder from a dead one. The locks here are `flock`
locks (the `filelock` package), which the kernel releases when the holding process dies, however
it dies; next to the lock a holder writes who it is (PID, host, process start time, command), so
a process that waits can say whom it waits for, and one that finds the file of a dead holder can
say so before it takes the lock over. A PID alone can be reused: a process is the one recorded only
if it started no later than the recorded start time.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from filelock import FileLock, Timeout

from conductor_pipeline.files import write_json_atomic

# How often a waiting process says whom it waits for.
WAIT_LOG_EVERY_S = 5.0
# Slack between a process's start time as psutil reports it and a time recorded after it started.
START_TIME_SLACK_S = 1.0


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as another one can recognise it later: PID, host, start time, command line."""

    pid: int
    host: str
    started_at: float
    command: str

    @classmethod
    def current(cls) -> ProcessIdentity:
        return cls(os.getpid(), socket.gethostname(), psutil.Process().create_time(), " ".join(sys.argv))

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at))
        return f"PID {self.pid} on {self.host} (started {started}: {self.command})"


def process_is_alive(pid: int, *, started_no_later_than: float | None = None) -> bool:
    """Whether process `pid` runs on this host (not a zombie) and, given a time, started no later
    than it (a later start is another process that got the PID)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        started = process.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return False
    return started_no_later_than is None or started <= started_no_later_than + START_TIME_SLACK_S


def identity_is_alive(identity: ProcessIdentity) -> bool:
    """Whether the recorded process still runs (on this host: another host's cannot be checked, so
    it counts as alive)."""
    if identity.host != socket.gethostname():
        return True
    return process_is_alive(identity.pid, started_no_later_than=identity.started_at)


def read_holder(path: Path) -> ProcessIdentity | None:
    """The identity a holder recorded beside its lock, or None (none recorded, or unreadable)."""
    try:
        return ProcessIdentity(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


@contextmanager
def held_lock(
    lock_path: Path, what: str, *, log: Callable[[str], object], wait_every_s: float = WAIT_LOG_EVERY_S
) -> Iterator[ProcessIdentity]:
    """Hold the lock at `lock_path` for the block, waiting (without end) while another process
    holds it and saying every `wait_every_s` who that is and how to stop waiting. The holder's
    identity is kept in `<lock>.holder.json`; one left by a dead process is reported, then replaced."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    holder_path = lock_path.with_name(f"{lock_path.name}.holder.json")
    lock = FileLock(str(lock_path))
    started = time.monotonic()
    timeout = 0.0  # the first look says at once that this run waits, then every `wait_every_s`
    while True:
        try:
            lock.acquire(timeout=timeout)
            break
        except Timeout:
            timeout = wait_every_s
            holder = read_holder(holder_path)
            who = holder.describe() if holder else "another process (it recorded no identity)"
            stop = f"`kill -TERM {holder.pid}` stops it" if holder else "stop it to go on"
            log(f"waiting {time.monotonic() - started:.0f}s for {what}: it is held by {who}; this run starts when "
                f"that one ends ({stop}; Ctrl-C stops waiting)")
    try:
        previous = read_holder(holder_path)
        if previous is not None and previous.pid != os.getpid() and not identity_is_alive(previous):
            log(f"{what}: the lock file {lock_path} was left by {previous.describe()}, which is gone; taking it over")
        me = ProcessIdentity.current()
        write_json_atomic(holder_path, asdict(me), "lock holder record")
        try:
            yield me
        finally:
            holder_path.unlink(missing_ok=True)
    finally:
        lock.release()
