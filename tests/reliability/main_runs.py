"""Run the real entry point, `python -m assets.main`, in a folder of its own, kill it, rerun it, and
read back what it left: the figures a run must reproduce and the state it must never corrupt.

`MainRun` says what to run: a pool, a settings file and extra arguments. It is the extension
point of the kill-anywhere tests: the default pool's whole run (`DEFAULT_RUN`), a small
configuration for the default suite (`SMALL_RUN`), and any other profile (a long training run)
by constructing another `MainRun`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import duckdb
import polars as pl

from assets.metadata import latest_metadata
from conductor_pipeline.files import is_temporary, manifest_problem
from conductor_pipeline.paths import DATA_DIR, PROJECT_ROOT
from conductor_pipeline.training.grpo import CHECKPOINT_MANIFEST, checkpoint_problem
from conductor_pipeline.world_model.persistence import MANIFEST as WORLD_MODEL_MANIFEST

SMALL_RUN_CONFIG = Path(__file__).with_name("small_run.yaml")
SMALL_TRAINING_RUN_CONFIG = Path(__file__).with_name("small_training_run.yaml")
# Columns of the arm table a rerun must reproduce: all but measured wall time.
MEASURED_COLUMNS = ("latency_per_question_s",)
RUN_TIMEOUT_S = 3600


@dataclass(frozen=True)
class MainRun:
    """One configuration of `python -m assets.main`: pool, settings file, extra arguments."""

    name: str
    pool: str = "replay-mixed6"
    config: Path | None = None
    extra_args: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        config = ["--config", str(self.config)] if self.config else []
        return [sys.executable, "-u", "-m", "assets.main", "--pool", self.pool, *config, *self.extra_args]


DEFAULT_RUN = MainRun("default pool, default settings (make run)")
# The same run on one torch thread: on a machine whose other core is busy, two threads are many
# times slower than one (KILL_ANYWHERE_RUN=tests.reliability.main_runs:DEFAULT_RUN_ONE_THREAD).
DEFAULT_RUN_ONE_THREAD = MainRun("default pool, default settings, one torch thread", extra_args=("--torch-threads", "1"))
SMALL_RUN = MainRun("default pool, small settings", config=SMALL_RUN_CONFIG)
TRAINING_RUN = MainRun("default pool, small settings with training", config=SMALL_TRAINING_RUN_CONFIG)


@dataclass(frozen=True)
class RunFolder:
    """A run's own DAGSTER_HOME and artifacts root."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "dagster_home"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    def prepare(self) -> RunFolder:
        self.home.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA_DIR / "dagster.yaml", self.home / "dagster.yaml")
        return self

    def env(self) -> dict[str, str]:
        env = {**os.environ, "DAGSTER_HOME": str(self.home), "CORYPHAEUS_ARTIFACTS": str(self.artifacts)}
        env.pop("CORYPHAEUS_WAREHOUSE", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
        return env

    def start(self, run: MainRun, log: Path) -> subprocess.Popen:
        """Start the run in its own session (so a kill reaches its grading workers too)."""
        with log.open("ab") as out:
            return subprocess.Popen(run.argv(), cwd=PROJECT_ROOT, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)


def kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the process and everything it started."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def log_lines(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines() if log.is_file() else []


def run_to_end(
    folder: RunFolder, run: MainRun, log: Path, timeout_s: float = RUN_TIMEOUT_S, progress: list | None = None
) -> float:
    """Run to completion; returns the wall time, raising with the output's tail when it fails.
    `progress` gets (seconds since start, lines of output so far) every quarter second."""
    started = time.monotonic()
    process = folder.start(run, log)
    while process.poll() is None:
        if time.monotonic() - started > timeout_s:
            kill_group(process)
            process.wait()
            raise AssertionError(f"{run.name} ran past {timeout_s}s:\n{log.read_text(errors='replace')[-4000:]}")
        if progress is not None:
            progress.append((time.monotonic() - started, len(log_lines(log))))
        time.sleep(0.25)
    if process.returncode != 0:
        raise AssertionError(f"{run.name} exited {process.returncode}:\n{log.read_text(errors='replace')[-6000:]}")
    return time.monotonic() - started


# A log line of a step: the step it names.
_STEP_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+0000 - dagster - \w+ - \w+ - [0-9a-f-]{36} - (?P<step>[a-z_][a-z_0-9]*) - ")


def step_starts(lines: list[str]) -> dict[str, int]:
    """Each step's first line, by index, in the order the steps began."""
    firsts: dict[str, int] = {}
    for index, line in enumerate(lines):
        match = _STEP_LINE.match(line)
        if match:
            firsts.setdefault(match["step"], index)
    return firsts


def last_step(log: Path) -> str:
    """The step the run's log names last (where a kill landed), or `start-up`."""
    steps = [m["step"] for m in map(_STEP_LINE.match, log_lines(log)) if m]
    return steps[-1] if steps else "start-up"


@dataclass(frozen=True)
class Moment:
    """A moment of the uninterrupted run as a point of the work: the step it was in, how many lines
    of output that step had printed, and the seconds since the last of them. A rerun skips finished
    steps and a loaded machine is slower, so a run is killed at the same point of its output
    instead of the same second: once the step has printed as many lines, that many seconds later,
    or as soon as the next line comes (the work got past the moment sooner)."""

    at_s: float
    step: str
    lines_in: int
    after_s: float
    # The step and those the reference began after it: a rerun that skips the step (it finished
    # before an earlier kill) is killed once it reaches any of them.
    reached_by: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.step}, after its line {self.lines_in} + {self.after_s:.1f}s"


def moment_of(reference_log: Path, progress: list[tuple[float, int]], at_s: float) -> Moment:
    """Where the reference run was `at_s` seconds in (`progress`: its (seconds, lines) samples)."""
    lines_then = max([count for when, count in progress if when <= at_s], default=0)
    line_seen_at = min([when for when, count in progress if count >= lines_then], default=0.0)
    starts = step_starts(log_lines(reference_log))
    begun = [(index, step) for step, index in starts.items() if index < lines_then]
    if not begun:
        return Moment(at_s, "start-up", lines_then, at_s - line_seen_at)
    index, step = max(begun)
    later = tuple(s for s, i in starts.items() if i >= index)
    return Moment(at_s, step, lines_then - index, at_s - line_seen_at, later)


def kill_at(folder: RunFolder, run: MainRun, moment: Moment, log: Path, timeout_s: float = RUN_TIMEOUT_S) -> str:
    """Start the run and SIGKILL it (and all it started) at `moment`. Returns the step it was in,
    or `after the end` when it finished first."""
    process = folder.start(run, log)
    deadline = time.monotonic() + timeout_s
    reached_at: float | None = None
    reached_lines = 0
    while process.poll() is None:
        assert time.monotonic() < deadline, f"{run.name} never reached {moment.describe()}"
        lines = log_lines(log)
        starts = step_starts(lines)
        if reached_at is None:
            here = starts.get(moment.step, 0 if moment.step == "start-up" else None)
            past = any(step in starts for step in moment.reached_by[1:])
            if past or (here is not None and len(lines) - here >= moment.lines_in):
                reached_at, reached_lines = time.monotonic(), len(lines)
                if past:
                    break
        elif time.monotonic() - reached_at >= moment.after_s or len(lines) > reached_lines:
            break
        time.sleep(0.05)
    finished = process.poll() is not None
    kill_group(process)
    process.wait()
    return "after the end" if finished else last_step(log)


# --- what a run leaves ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """The figures that must come out the same however often the run was killed and rerun."""

    eval_run_id: str
    gate_figure: float | None
    checkpoint_step: int | None
    tables: dict[str, list[dict]] = field(default_factory=dict)

    def differences(self, other: Outcome) -> list[str]:
        found = []
        for name in ("eval_run_id", "gate_figure", "checkpoint_step"):
            if getattr(self, name) != getattr(other, name):
                found.append(f"{name}: {getattr(self, name)!r} != {getattr(other, name)!r}")
        for table in sorted(set(self.tables) | set(other.tables)):
            if self.tables.get(table) != other.tables.get(table):
                found.append(f"table {table} differs")
        return found


def read_outcome(folder: RunFolder) -> Outcome:
    """The eval run id, the gate figure, the trained checkpoint's step and every eval table."""
    with dg.DagsterInstance.from_config(str(folder.home)) as instance:
        tables_meta = latest_metadata(instance, "eval_tables")
        probe = latest_metadata(instance, "grpo_probe_run") or {}
        checkpoint = latest_metadata(instance, "conductor_checkpoint") or {}
    assert tables_meta is not None, "eval_tables was never materialized"
    run_id = tables_meta["run_id"].value
    tables = {}
    for path in sorted((folder.artifacts / "eval_tables").glob(f"{run_id}_*.parquet")):
        frame = pl.read_parquet(path)
        frame = frame.drop([c for c in MEASURED_COLUMNS if c in frame.columns])
        tables[path.stem.removeprefix(f"{run_id}_")] = frame.to_dicts()
    return Outcome(
        eval_run_id=run_id,
        gate_figure=probe["zero_variance_fraction"].value if "zero_variance_fraction" in probe else None,
        checkpoint_step=checkpoint["global_step"].value if "global_step" in checkpoint else None,
        tables=tables,
    )


WAREHOUSE_CHECKS = {
    "duplicate call keys": "SELECT count(*) - count(DISTINCT call_id) FROM calls",
    "duplicate workflow keys": "SELECT count(*) - count(DISTINCT workflow_id) FROM workflows",
    "duplicate training-step keys": "SELECT count(*) - count(DISTINCT (run_id, step)) FROM training_steps",
    "duplicate question keys": "SELECT count(*) - count(DISTINCT question_id) FROM questions",
    "calls without their workflow": (
        "SELECT count(*) FROM calls c WHERE c.workflow_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM workflows w WHERE w.workflow_id = c.workflow_id)"
    ),
    "parsed workflows without all their step calls": (
        "SELECT count(*) FROM workflows w WHERE w.parse_code = 'ok' AND w.n_steps <> "
        "(SELECT count(*) FROM calls c WHERE c.workflow_id = w.workflow_id AND c.kind = 'step')"
    ),
    "training steps without their rollouts": (
        "SELECT count(*) FROM training_steps s WHERE NOT EXISTS "
        "(SELECT 1 FROM workflows w WHERE w.run_id = s.run_id AND w.training_step = s.step)"
    ),
}


def warehouse_problems(folder: RunFolder) -> list[str]:
    """Duplicate keys, calls without their workflow and the reverse, steps without rollouts."""
    with duckdb.connect(str(folder.artifacts / "warehouse.duckdb"), read_only=True) as con:
        found = {name: con.execute(sql).fetchone()[0] for name, sql in WAREHOUSE_CHECKS.items()}
    return [f"{name}: {count}" for name, count in found.items() if count]


def artifact_problems(folder: RunFolder) -> tuple[list[str], list[str]]:
    """(artifact files that are not whole, staging files left by killed writes). A file is whole
    when it parses as what its name says; a checkpoint or model folder when its manifest verifies
    (an unsealed checkpoint is allowed only while nothing takes it for complete)."""
    problems, leftovers = [], []
    for path in sorted(folder.artifacts.rglob("*")):
        if not path.is_file():
            continue
        if is_temporary(path) or ".staging" in str(path):
            leftovers.append(str(path))
            continue
        try:
            if path.suffix == ".parquet":
                pl.read_parquet(path)
            elif path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".png" and not path.read_bytes().endswith(b"IEND\xaeB`\x82"):
                problems.append(f"{path}: PNG cut short")
        except Exception as exc:  # noqa: BLE001 (any failure to read is the finding)
            problems.append(f"{path}: {exc}")
    for manifest in folder.artifacts.rglob(WORLD_MODEL_MANIFEST):
        if manifest.parent.parent.name == "world_model":
            problem = manifest_problem(manifest.parent, WORLD_MODEL_MANIFEST)
            problems += [f"world model: {problem}"] if problem else []
    with dg.DagsterInstance.from_config(str(folder.home)) as instance:
        checkpoint = (latest_metadata(instance, "conductor_checkpoint") or {}).get("checkpoint_path")
    if checkpoint is not None:
        problem = checkpoint_problem(Path(checkpoint.value))
        problems += [f"the trained checkpoint {checkpoint.value} is not whole: {problem}"] if problem else []
    for folder_path in folder.artifacts.rglob("checkpoint-*"):
        if folder_path.is_dir() and not (folder_path / CHECKPOINT_MANIFEST).is_file():
            leftovers.append(f"{folder_path} (unsealed: never resumed from)")
    return problems, leftovers
