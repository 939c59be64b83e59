"""Kill anywhere: SIGKILL `python -m assets.main` at random moments of its wall time, rerun it to
the end, and it must print the figures of a run that was never killed, with a warehouse and
artifacts that were never corrupted.

For each kill point: a fresh folder, the run started and SIGKILLed (with everything it started)
at the point, then rerun until it exits 0, then compared with an uninterrupted run of the same
commit: the eval run id, the gate figure, the trained checkpoint's step and every eval table (arm
accuracies, every paired comparison, the running gap, the cost sweep) must be identical; the
warehouse must hold no duplicate key, no call without its workflow and no parsed workflow without
its step calls; every artifact file must be whole (or absent), and the checkpoint handed on sealed.

The kill points are spread over the uninterrupted run's wall time: the i-th of N is a seeded
uniform moment within the i-th N-th of it (KILL_SEED replays a schedule; it is printed).

- slow set (`make test-slow`): the default pool's whole default run, N = KILL_POINTS (20);
- default suite: the same on `SMALL_RUN` (small settings, `tests/reliability/small_run.yaml`),
  one kill point.

`KILL_ANYWHERE_RUN` names another `MainRun` (`module:attribute`) to cover another profile;
`KILL_POINTS` sets N; `KILL_ANYWHERE_PROGRESS` names a file that gets each point's line as it is
done, and `KILL_ANYWHERE_REPORT` one that gets the slow test's summary.
"""

from __future__ import annotations

import importlib
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.reliability.main_runs import (
    DEFAULT_RUN,
    SMALL_RUN,
    MainRun,
    Outcome,
    RunFolder,
    artifact_problems,
    kill_group,
    last_step,
    read_outcome,
    run_to_end,
    warehouse_problems,
)
from tests.shared_data import require_shared_data

SEED = int(os.environ.get("KILL_SEED", str(random.SystemRandom().randrange(10_000))))
KILL_POINTS = int(os.environ.get("KILL_POINTS", "20"))
# A rerun that itself fails is retried this often (each retry is reported) before the point counts as lost.
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
    at_s: float
    step: str
    reruns: int = 0
    recovered: bool = False
    identical: bool = False
    problems: tuple[str, ...] = ()

    def line(self) -> str:
        verdict = "identical" if self.identical else "DIFFERENT" if self.recovered else "NOT RECOVERED"
        problems = f"; {'; '.join(self.problems)}" if self.problems else ""
        return f"kill {self.index + 1} at {self.at_s:.1f}s (in {self.step}): {self.reruns} rerun(s), {verdict}{problems}"


def kill_moments(total_s: float, points: int, rng: random.Random) -> list[float]:
    """One seeded moment in each of `points` equal slices of `total_s`."""
    return [total_s * (i + rng.random()) / points for i in range(points)]


def try_kill_point(tmp: Path, run: MainRun, index: int, at_s: float, reference: Outcome) -> KillPoint:
    """A fresh folder: start, SIGKILL at `at_s`, rerun to the end, compare with `reference`."""
    folder = RunFolder(tmp / f"kill{index}").prepare()
    killed_log = folder.root / "killed.log"
    process = folder.start(run, killed_log)
    time.sleep(at_s)
    finished_first = process.poll() is not None
    kill_group(process)
    process.wait()
    point = KillPoint(index, at_s, "after the end" if finished_first else last_step(killed_log))
    for attempt in range(MAX_RERUNS):
        try:
            run_to_end(folder, run, folder.root / f"rerun{attempt}.log")
        except AssertionError as exc:
            point.problems += (f"rerun {attempt + 1} failed: {str(exc)[-300:]}",)
            continue
        point.reruns, point.recovered = attempt + 1, True
        break
    if not point.recovered:
        return point
    differences = reference.differences(read_outcome(folder))
    broken, _leftovers = artifact_problems(folder)
    point.problems += tuple(differences + warehouse_problems(folder) + broken)
    point.identical = not differences
    if point.identical and not point.problems:
        shutil.rmtree(folder.root)  # hundreds of MB a point; a failing one is kept to look at
    return point


def kill_anywhere(tmp: Path, run: MainRun, points: int, seed: int) -> tuple[list[KillPoint], float]:
    """The uninterrupted reference, then every kill point; returns the points and the reference's wall time."""
    reference_folder = RunFolder(tmp / "reference").prepare()
    wall = run_to_end(reference_folder, run, reference_folder.root / "run.log")
    reference = read_outcome(reference_folder)
    assert not warehouse_problems(reference_folder)
    assert not artifact_problems(reference_folder)[0]
    rng = random.Random(seed)
    progress = os.environ.get("KILL_ANYWHERE_PROGRESS")  # a file that gets each point's line as it is done
    results = []
    for index, at in enumerate(kill_moments(wall, points, rng)):
        results.append(try_kill_point(tmp, run, index, at, reference))
        if progress:
            with open(progress, "a") as out:
                out.write(f"{results[-1].line()} (reference {wall:.0f}s, seed {seed})\n")
    return results, wall


def report(run: MainRun, results: list[KillPoint], wall: float, seed: int) -> str:
    recovered = sum(p.recovered for p in results)
    identical = sum(p.identical for p in results)
    lines = [f"kill anywhere, {run.name} (KILL_SEED={seed}; uninterrupted run {wall:.0f}s): "
             f"{len(results)} kill points, {recovered} recovered, {identical} identical to the uninterrupted run",
             *(p.line() for p in results)]
    return "\n".join(lines)


def test_the_small_run_killed_at_a_random_moment_reruns_to_the_same_tables(tmp_path: Path, monkeypatch) -> None:
    """The bounded variant: one kill point of the small configuration, through the real entry point."""
    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train",
                        "zeroeval_outputs")
    run = run_under_test(SMALL_RUN)
    results, wall = kill_anywhere(tmp_path, run, 1, SEED)
    print("\n" + report(run, results, wall, SEED))
    assert all(p.recovered and p.identical and not p.problems for p in results), report(run, results, wall, SEED)


@pytest.mark.slow
def test_the_default_run_killed_at_twenty_moments_reruns_to_the_same_tables(tmp_path: Path, monkeypatch) -> None:
    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train",
                        "zeroeval_outputs")
    run = run_under_test(DEFAULT_RUN)
    results, wall = kill_anywhere(tmp_path, run, KILL_POINTS, SEED)
    text = report(run, results, wall, SEED)
    print("\n" + text)
    out = os.environ.get("KILL_ANYWHERE_REPORT")
    if out:
        Path(out).write_text(text + "\n")
    assert all(p.recovered and p.identical and not p.problems for p in results), text
