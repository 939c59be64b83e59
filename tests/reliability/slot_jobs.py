"""A job with one step in the concurrency pool `gpu`, run the way `make run` runs a job: in process,
under `SlotWaitMonitor`, SIGTERM handled as Ctrl-C, optionally tagged with this process.

    python -m tests.reliability.slot_jobs RELEASE_FILE [--tagged]

The step prints `STEP-STARTED <pid>` and holds its slot until RELEASE_FILE exists. The process
prints `RUN <run id>` first and `RESULT <success> <signal>` last; it exits 0 on success, 130 when
a signal stopped it, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import dagster as dg

from assets.dead_runs import SlotWaitMonitor, process_tags, sigterm_as_ctrl_c

POOL = "gpu"


def say(line: str) -> None:
    """One marker line in one write: a print writes the text and its newline apart, and Dagster's log
    lines, on the same file, can land between them and run into the marker."""
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


def gpu_job(release: Path) -> dg.JobDefinition:
    @dg.asset(pool=POOL)
    def gpu_step() -> None:
        say(f"STEP-STARTED {os.getpid()}")
        while not release.exists():
            time.sleep(0.1)

    return dg.Definitions(assets=[gpu_step], jobs=[dg.define_asset_job("gpu_job", [gpu_step])]).resolve_job_def("gpu_job")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("release_file", type=Path)
    parser.add_argument("--tagged", action="store_true", help="tag the run with this process, as make run does")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, sigterm_as_ctrl_c)
    job = gpu_job(args.release_file)
    run_id = str(uuid.uuid4())
    say(f"RUN {run_id}")
    instance = dg.DagsterInstance.get()
    with SlotWaitMonitor(instance, run_id, say, every_s=1.0).watching() as monitor:
        result = job.execute_in_process(
            instance=instance, run_id=run_id, tags=process_tags() if args.tagged else {}, raise_on_error=False
        )
    say(f"RESULT {result.success} {monitor.signal}")
    if monitor.signal is not None:
        return 130
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
