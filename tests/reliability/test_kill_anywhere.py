"""Kill anywhere: SIGKILL `python -m assets.main` at random moments of its wall time, rerun it to
the end, and it must print the figures of a run that was never killed, with a warehouse and
artifacts that were never corrupted.

First an uninterrupted run of the same commit (the reference). The N kill moments are spread over
its wall time: the i-th is a seeded uniform moment within the i-th N-th of it (KILL_SEED replays a
schedule; it is printed), and each is turned into a point of the work, the step the reference was
in, how many lines of output it had printed and the seconds since the last (`Moment`), so a run is
killed at the same point of the work however loaded the machine is. The points are taken in chains of KILL_CHAIN: a fresh folder, the run killed
(with everything it started) at the chain's first point, rerun and killed at its second, and so on,
then rerun until it exits 0 (KILL_CHAIN=1: every point on a fresh folder of its own). Each rerun must
go on without a failed step, and no run may be left unfinished (each killed one is marked failed); at the end of the chain it is compared
with the reference: the eval run id, the gate figure, the trained checkpoint's step and every eval
table (arm accuracies, every paired comparison, the running gap, the cost sweep) must be identical;
the warehouse must hold no duplicate key, no call without its workflow and no parsed workflow
without its step calls; every artifact file must be whole (or absent), and the checkpoint handed on
sealed.

- slow set (`make test-slow`): the default pool's whole default run, N = KILL_POINTS (20) in chains
  of KILL_CHAIN (5): on a shared 2-core machine a default run takes 4 to 25 minutes, and a point on
  a folder of its own costs a whole run;
- `SMALL_RUN` (small settings, `tests/reliability/small_run.yaml`), one point: three runs of the
  entry point, about three minutes on two busy cores, so it is a soak too (`make test-slow`); the
  default suite keeps the deterministic kills (`test_dead_runs`, `test_kill`, `test_damaged_files`).

`KILL_ANYWHERE_RUN` names another `MainRun` (`module:attribute`) to cover another profile;
`KILL_ANYWHERE_PROGRESS` names a file that gets each chain's lines as it is done, and
`KILL_ANYWHERE_REPORT` one that gets the slow test's summary.
"""

from __future__ import annotations

import importlib
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from assets.dead_runs import UNFINISHED
from tests.reliability.main_runs import (
    DEFAULT_RUN,
    SMALL_RUN,
    MainRun,
    Moment,
    Outcome,
    RunFolder,
    artifact_problems,
    kill_at,
    moment_of,
    read_outcome,
    run_to_end,
    warehouse_problems,
)

SEED = int(os.environ.get("KILL_SEED", str(random.SystemRandom().randrange(10_000))))
KILL_POINTS = int(os.environ.get("KILL_POINTS", "20"))
KILL_CHAIN = int(os.environ.get("KILL_CHAIN", "5"))
# A final rerun that itself fails is retried this often (each failure is reported) before the chain counts as lost.
MAX_RERUNS = 3


def run_under_test(default: MainRun) -> MainRun:
    """`default`, or the `MainRun` that KILL_ANYWHERE_RUN names (`package.module:attribute`)."""
    named = os.environ.get("KILL_ANYWHERE_RUN")
    if not named:
        return default
    module, _, attribute = named.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass
class KillPoint:
    """One kill and what came of it."""

    index: int
    moment: Moment
    landed: str = ""
    recovered: bool = False
    identical: bool = False
    problems: tuple[str, ...] = ()

    def line(self) -> str:
        verdict = "identical" if self.identical else "DIFFERENT" if self.recovered else "NOT RECOVERED"
        problems = f"; {'; '.join(self.problems)}" if self.problems else ""
        m = self.moment
        return (f"kill {self.index + 1} at {m.at_s:.1f}s of the reference ({m.describe()}), landed in "
                f"{self.landed}: {'recovered' if self.recovered else 'not recovered'}, {verdict}{problems}")


def kill_moments(total_s: float, points: int, rng: random.Random) -> list[float]:
    """One seeded moment in each of `points` equal slices of `total_s`."""
    return [total_s * (i + rng.random()) / points for i in range(points)]


def chains(points: list[KillPoint], per_chain: int) -> list[list[KillPoint]]:
    """The points dealt round-robin into chains of `per_chain`: each chain's kills spread over the run."""
    count = max(1, -(-len(points) // max(1, per_chain)))
    return [points[c::count] for c in range(count)]


def rerun_failures(log: Path) -> list[str]:
    """A rerun's step failures (a closed gate is a result, not a failure), from its output."""
    return [line.strip() for line in log.read_text(errors="replace").splitlines() if line.startswith("   step ")]


def unfinished_runs(folder: RunFolder) -> list[str]:
    """Runs of the folder's instance left unfinished (a killed one nobody marked failed)."""
    with dg.DagsterInstance.from_config(str(folder.home)) as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(statuses=UNFINISHED))
    return [f"run {run.run_id} ({run.job_name}) left {run.status.value}" for run in runs]


def try_chain(tmp: Path, run: MainRun, number: int, points: list[KillPoint], reference: Outcome) -> None:
    """A fresh folder: killed at each point in turn, rerun to the end, compared with `reference`."""
    folder = RunFolder(tmp / f"chain{number}").prepare()
    logs = [folder.root / f"killed{j}.log" for j in range(len(points))]
    for point, log in zip(points, logs, strict=True):
        point.landed = kill_at(folder, run, point.moment, log)
    final = None
    for attempt in range(MAX_RERUNS):
        log = folder.root / f"final{attempt}.log"
        try:
            run_to_end(folder, run, log)
            final = log
            break
        except AssertionError as exc:
            points[-1].problems += (f"final rerun {attempt + 1} failed: {str(exc)[-300:]}",)
    # Recovered: the process after the kill went on without a failed step (and at the end no run of
    # the chain is left unfinished: each killed one was marked failed).
    followers = [*logs[1:], final]
    for point, follower in zip(points, followers, strict=True):
        if follower is not None:
            failures = rerun_failures(follower)
            point.recovered = not failures
            point.problems += tuple(failures)
    if final is None:
        return
    differences = reference.differences(read_outcome(folder))
    broken, _leftovers = artifact_problems(folder)
    problems = tuple(differences + warehouse_problems(folder) + broken + unfinished_runs(folder))
    for point in points:
        point.identical = point.recovered and not differences
        point.problems += problems
    if all(p.identical and not p.problems for p in points):
        shutil.rmtree(folder.root)  # hundreds of MB a chain; a failing one is kept to look at


def kill_anywhere(tmp: Path, run: MainRun, points: int, per_chain: int, seed: int) -> tuple[list[KillPoint], float]:
    """The uninterrupted reference, then every chain of kill points; returns the points and the reference's wall time."""
    reference_folder = RunFolder(tmp / "reference").prepare()
    progress_samples: list[tuple[float, int]] = []
    wall = run_to_end(reference_folder, run, reference_folder.root / "run.log", progress=progress_samples)
    reference = read_outcome(reference_folder)
    assert not warehouse_problems(reference_folder)
    assert not artifact_problems(reference_folder)[0]
    rng = random.Random(seed)
    moments = [moment_of(reference_folder.root / "run.log", progress_samples, at) for at in kill_moments(wall, points, rng)]
    results = [KillPoint(i, moment) for i, moment in enumerate(moments)]
    progress = os.environ.get("KILL_ANYWHERE_PROGRESS")
    for number, chain in enumerate(chains(results, per_chain)):
        try_chain(tmp, run, number, chain, reference)
        if progress:
            with open(progress, "a") as out:
                out.writelines(f"chain {number + 1}: {p.line()} (reference {wall:.0f}s, seed {seed})\n" for p in chain)
    return results, wall


def report(run: MainRun, results: list[KillPoint], wall: float, seed: int, per_chain: int) -> str:
    recovered = sum(p.recovered for p in results)
    identical = sum(p.identical for p in results)
    head = (f"kill anywhere, {run.name} (KILL_SEED={seed}; uninterrupted run {wall:.0f}s; chains of {per_chain}): "
            f"{len(results)} kill points, {recovered} recovered, {identical} identical to the uninterrupted run")
    return "\n".join([head, *(p.line() for p in sorted(results, key=lambda p: p.index))])


@pytest.mark.slow
def test_the_small_run_killed_at_a_random_moment_reruns_to_the_same_tables(tmp_path: Path, default_run_data: None) -> None:
    """The bounded variant: one kill point of the small configuration, through the real entry point."""
    run = run_under_test(SMALL_RUN)
    results, wall = kill_anywhere(tmp_path, run, 1, 1, SEED)
    text = report(run, results, wall, SEED, 1)
    print("\n" + text)
    assert all(p.recovered and p.identical and not p.problems for p in results), text


@pytest.mark.slow
def test_the_default_run_killed_at_twenty_moments_reruns_to_the_same_tables(tmp_path: Path, default_run_data: None) -> None:
    run = run_under_test(DEFAULT_RUN)
    results, wall = kill_anywhere(tmp_path, run, KILL_POINTS, KILL_CHAIN, SEED)
    text = report(run, results, wall, SEED, KILL_CHAIN)
    print("\n" + text)
    out = os.environ.get("KILL_ANYWHERE_REPORT")
    if out:
        Path(out).write_text(text + "\n")
    assert all(p.recovered and p.identical and not p.problems for p in results), text
