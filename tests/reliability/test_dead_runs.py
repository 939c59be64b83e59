"""A dead run frees what it held; a waiting step says who holds its slot; SIGTERM and Ctrl-C stop
a run cleanly.

Real processes on a real Dagster instance in a tmp DAGSTER_HOME: `slot_jobs` runs a job whose one
step sits in the `gpu` pool (as training does) the way `make run` runs a job. Killed with SIGKILL
mid-step, it leaves its run STARTED and its slot claimed, as the issue found with
`python -m assets.main` killed during `grpo_probe_run`; the next `make run` must mark it failed
(naming the process) and free the slot before it plans anything.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from assets.dead_runs import reap_dead_runs
from conductor_pipeline.paths import PROJECT_ROOT
from tests.reliability.dagster_cli import dagster_env
from tests.shared_data import require_shared_data

WAIT_S = 60


class Job:
    """One `slot_jobs` process and its output."""

    def __init__(self, env: dict[str, str], folder: Path, name: str, *, tagged: bool = True) -> None:
        self.release = folder / f"{name}.release"
        self.log = folder / f"{name}.log"
        argv = [sys.executable, "-u", "-m", "tests.reliability.slot_jobs", str(self.release)]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([*argv, *(["--tagged"] if tagged else [])], cwd=PROJECT_ROOT, env=env,
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str) -> re.Match:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            assert self.process.poll() is None, f"ended before {pattern!r}:\n{self.output[-3000:]}"
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} within {WAIT_S}s:\n{self.output[-3000:]}")

    @property
    def run_id(self) -> str:
        return self.wait_for(r"RUN (\S+)\n")[1]

    def finish(self, timeout: float = WAIT_S) -> int:
        self.release.touch()
        return self.process.wait(timeout=timeout)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return dagster_env(tmp_path / "dagster_home", None)


@pytest.fixture
def main_env(env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of `python -m assets.main` on that instance, artifacts in tmp, the shared data."""
    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train")
    return {**env, "CORYPHAEUS_ARTIFACTS": str(tmp_path / "artifacts"),
            **{key: os.environ[key] for key in ("CORYPHAEUS_DATA_DIR", "CORYPHAEUS_CACHE_DIR")}}


def instance_at(env: dict[str, str]) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(env["DAGSTER_HOME"])


def slots(instance: dg.DagsterInstance) -> list[tuple[str, str]]:
    info = instance.event_log_storage.get_concurrency_info("gpu")
    return [(slot.run_id, slot.step_key) for slot in info.claimed_slots]


def failure_message(instance: dg.DagsterInstance, run_id: str) -> str:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    return records[-1].event_log_entry.dagster_event.message if records else ""


@pytest.mark.parametrize("tagged", [True, False], ids=["tagged by make run", "untagged (CLI, earlier versions)"])
def test_a_run_killed_mid_step_is_marked_failed_naming_its_process_and_its_slot_freed(
    env: dict[str, str], tmp_path: Path, tagged: bool
) -> None:
    holder = Job(env, tmp_path, "holder", tagged=tagged)
    pid = int(holder.wait_for(r"STEP-STARTED (\d+)\n")[1])
    os.killpg(holder.process.pid, signal.SIGKILL)
    holder.process.wait()
    with instance_at(env) as instance:
        assert instance.get_run_by_id(holder.run_id).status == dg.DagsterRunStatus.STARTED  # what the issue found
        assert slots(instance) == [(holder.run_id, "gpu_step")]
        lines: list[str] = []
        assert reap_dead_runs(instance, lines.append) == [holder.run_id]
        assert instance.get_run_by_id(holder.run_id).status == dg.DagsterRunStatus.FAILURE
        assert f"PID {pid}" in failure_message(instance, holder.run_id) and "is gone" in failure_message(instance, holder.run_id)
        assert slots(instance) == []
        assert f"its process PID {pid} is gone" in lines[0] and "gpu (gpu_step)" in lines[0]
        assert reap_dead_runs(instance, lines.append) == []  # nothing left to do


def test_a_live_run_is_left_alone(env: dict[str, str], tmp_path: Path) -> None:
    holder = Job(env, tmp_path, "holder")
    holder.wait_for(r"STEP-STARTED")
    with instance_at(env) as instance:
        assert reap_dead_runs(instance, lambda line: None) == []
        assert slots(instance) == [(holder.run_id, "gpu_step")]
    assert holder.finish() == 0


def test_a_waiting_step_says_who_holds_the_slot_and_goes_on_when_the_holder_dies(env: dict[str, str], tmp_path: Path) -> None:
    holder = Job(env, tmp_path, "holder")
    holder_pid = int(holder.wait_for(r"STEP-STARTED (\d+)\n")[1])
    waiter = Job(env, tmp_path, "waiter")
    waiter.release.touch()  # once it gets the slot, its step ends at once
    said = waiter.wait_for(r"step gpu_step has waited \d+s for a slot of pool 'gpu', held by run (\S+) \(gpu_job, "
                           r"step gpu_step, PID (\d+)\); .*kill -TERM (\d+)")
    assert said[1] == holder.run_id and int(said[2]) == int(said[3]) == holder_pid
    # And again, every few seconds: a report after the ones printed so far (the first may already say
    # "2s" on a loaded machine, so a pattern on the seconds alone can match it).
    reported = waiter.output.count("has waited")
    waiter.wait_for(rf"(?s)(?:has waited.*?){{{reported + 1}}}")
    assert waiter.output.count("has waited") > reported
    os.killpg(holder.process.pid, signal.SIGKILL)  # the holder dies: the waiter frees its slot and goes on
    assert waiter.process.wait(timeout=WAIT_S) == 0, waiter.output[-3000:]
    assert f"its process PID {holder_pid} is gone: marked failed" in waiter.output
    with instance_at(env) as instance:
        assert instance.get_run_by_id(holder.run_id).status == dg.DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(waiter.run_id).status == dg.DagsterRunStatus.SUCCESS
        assert slots(instance) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_stops_a_waiting_run_and_a_running_one_cleanly_freeing_their_slots(
    env: dict[str, str], tmp_path: Path, sig: int
) -> None:
    holder = Job(env, tmp_path, "holder")
    holder.wait_for(r"STEP-STARTED")
    waiter = Job(env, tmp_path, "waiter")
    waiter.wait_for(r"has waited")
    os.kill(waiter.process.pid, sig)  # waiting for a slot: Dagster's own loop would wait on
    assert waiter.process.wait(timeout=WAIT_S) == 128 + sig, waiter.output[-3000:]
    with instance_at(env) as instance:
        assert instance.get_run_by_id(waiter.run_id).status == dg.DagsterRunStatus.FAILURE
        assert f"Interrupted by {signal.Signals(sig).name}" in failure_message(instance, waiter.run_id)
        pending = instance.event_log_storage.get_concurrency_info("gpu").pending_steps
        assert [p for p in pending if p.run_id == waiter.run_id] == []
        assert slots(instance) == [(holder.run_id, "gpu_step")]

    os.kill(holder.process.pid, sig)  # running its step: the step fails as interrupted, the slot is freed
    assert holder.process.wait(timeout=WAIT_S) == 130, holder.output[-3000:]
    assert f"RESULT False {int(sig)}" in holder.output
    with instance_at(env) as instance:
        assert instance.get_run_by_id(holder.run_id).status == dg.DagsterRunStatus.FAILURE
        assert slots(instance) == []


def test_make_run_frees_a_dead_runs_slot_before_it_plans_anything(
    env: dict[str, str], main_env: dict[str, str], tmp_path: Path
) -> None:
    """The reported case: a run killed mid-step in pool `gpu` (untagged, as every run was before)
    holds its slot; the next `python -m assets.main` says so, fails that run and frees the slot."""
    holder = Job(env, tmp_path, "holder", tagged=False)
    pid = int(holder.wait_for(r"STEP-STARTED (\d+)\n")[1])
    os.killpg(holder.process.pid, signal.SIGKILL)
    holder.process.wait()
    done = subprocess.run([sys.executable, "-m", "assets.main", "--only", "corpora_job"], cwd=PROJECT_ROOT,
                          env=main_env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reaped = done.stdout.index(f"run {holder.run_id} (gpu_job) was STARTED but its process PID {pid} is gone")
    assert reaped < done.stdout.index("== corpora_job")  # before anything was planned
    with instance_at(env) as instance:
        assert instance.get_run_by_id(holder.run_id).status == dg.DagsterRunStatus.FAILURE
        assert slots(instance) == []


@pytest.mark.slow
def test_ctrl_c_stops_make_run_cleanly_and_a_rerun_resumes(
    env: dict[str, str], main_env: dict[str, str], tmp_path: Path
) -> None:
    """Ctrl-C in a terminal (SIGINT to the whole process group) while a job runs: the run stops,
    saying so (exit 130), no later job starts, no run is left STARTED, no slot claimed; a rerun goes
    on. (Slow set: the signal handling itself is tested on `slot_jobs` in the default suite.)"""
    argv = [sys.executable, "-u", "-m", "assets.main", "--only", "corpora_job", "--only", "probe_job"]
    log = tmp_path / "main.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, cwd=PROJECT_ROOT, env=main_env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    deadline = time.monotonic() + 300
    while "== corpora_job: 4 to materialize" not in log.read_text(errors="replace"):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(timeout=120) == 130, log.read_text(errors="replace")[-3000:]
    output = log.read_text(errors="replace")
    assert "interrupted" in output and "== probe_job" not in output
    with instance_at(env) as instance:
        unfinished = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
        assert unfinished == [] and slots(instance) == []
    again = subprocess.run(argv, cwd=PROJECT_ROOT, env=main_env, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0 and "== probe_job: ok" in again.stdout, again.stdout[-3000:]
