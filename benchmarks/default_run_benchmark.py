"""Time the README's commands from fresh clones: a baseline commit and the current one, side by side.

Usage: python -m benchmarks.default_run_benchmark [--baseline 928a1c3] [--current HEAD]
       [--cold-cache] [--steps install,run,rerun,test] [--baseline-steps STEPS] [--repeats N] [--workdir DIR]
       [--keep] [--dry-run] [--output benchmarks/RESULTS-default-run.md]

For each commit: `git clone` this repository into a temporary folder, check the commit out, then
run and time, in that folder and in this order,

- install: `make setup` (the virtualenv and every dependency),
- run:     `make run` (the whole graph on the default pool, into an empty Dagster instance),
- rerun:   `make run` again, nothing changed,
- test:    `make test`.

It prints the seconds of each step for both commits and the ratio baseline / current (above 1: the
current commit is faster), and writes the same table, with the machine and the commits, to
--output. A step that fails is reported with its exit status and the tail of its output (the full
output is in the work folder with --keep), and later steps of that commit still run.
--baseline-steps times only some of the steps on the baseline (its rerun recomputes the whole
graph: as long as its run); the table shows "-" for the others.
--cold-cache gives each clone empty pip and uv caches, so the install downloads everything;
without it the install uses the caches this machine already has (warm after the first commit).
--repeats N (only with the step test, and install) installs both clones first (their seconds are
printed), then runs `make test` N times in turn, baseline then current, and reports
each commit's median with its range and the median of the N pairwise ratios: a machine whose speed
drifts moves both runs of a pair alike.
--dry-run clones and checks out both commits and prints the commands, without running them.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from conductor_pipeline.reproducibility import cpu_signature

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = "928a1c3"
DEFAULT_OUTPUT = PROJECT_ROOT / "benchmarks" / "RESULTS-default-run.md"
STEPS: dict[str, list[str]] = {
    "install": ["make", "setup"],
    "run": ["make", "run"],
    "rerun": ["make", "run"],
    "test": ["make", "test"],
}
# Settings of this process that would point a clone's run at this checkout's files.
INHERITED_PREFIXES_DROPPED = ("CORYPHAEUS_", "DAGSTER_")
KEPT = {"CORYPHAEUS_DATA_DIR"}
TAIL_CHARS = 2000


@dataclass
class StepResult:
    step: str
    seconds: float
    returncode: int
    tail: str = ""


def git(*args: str, cwd: Path = PROJECT_ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def clone_at(commit: str, into: Path) -> str:
    """A fresh clone of this repository at `commit` in `into`; returns the full commit id."""
    full = git("rev-parse", "--verify", f"{commit}^{{commit}}")
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(PROJECT_ROOT), str(into)], check=True)
    git("checkout", "--quiet", "--detach", full, cwd=into)
    return full


def clone_environment(clone: Path, cold_cache: bool) -> dict[str, str]:
    """This process's environment without the project settings that would point at this checkout;
    the shared data mirror next to this checkout is kept, since a clone in a temp folder has none."""
    env = {
        key: value for key, value in os.environ.items()
        if key in KEPT or not key.startswith(INHERITED_PREFIXES_DROPPED)
    }
    env.pop("VIRTUAL_ENV", None)
    mirror = PROJECT_ROOT.parent / "shared" / "data"
    if "CORYPHAEUS_DATA_DIR" not in env and mirror.is_dir():
        env["CORYPHAEUS_DATA_DIR"] = str(mirror)
    if cold_cache:
        env["UV_CACHE_DIR"] = str(clone.parent / f"{clone.name}-uv-cache")
        env["PIP_CACHE_DIR"] = str(clone.parent / f"{clone.name}-pip-cache")
    return env


def run_step(step: str, clone: Path, env: dict[str, str], log_dir: Path, attempt: int = 0) -> StepResult:
    started = time.monotonic()
    completed = subprocess.run(STEPS[step], cwd=clone, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    output = completed.stdout + completed.stderr
    (log_dir / f"{clone.name}-{step}{f'-{attempt}' if attempt else ''}.log").write_text(output)
    return StepResult(step, seconds, completed.returncode, output[-TAIL_CHARS:])


def ratio(baseline: StepResult | None, current: StepResult | None) -> str:
    if baseline is None or current is None or baseline.returncode or current.returncode or current.seconds <= 0:
        return "n/a"
    return f"{baseline.seconds / current.seconds:.1f}x"


def cell(result: StepResult | None) -> str:
    if result is None:
        return "-"
    return f"{result.seconds:.1f}" + ("" if result.returncode == 0 else f" (exit {result.returncode})")


def results_table(steps: list[str], baseline: dict[str, StepResult], current: dict[str, StepResult]) -> str:
    rows = ["| step | command | baseline s | current s | baseline / current |", "|---|---|---:|---:|---:|"]
    for step in steps:
        b, c = baseline.get(step), current.get(step)
        rows.append(f"| {step} | `{' '.join(STEPS[step])}` | {cell(b)} | {cell(c)} | {ratio(b, c)} |")
    return "\n".join(rows)


def repeated_cell(results: list[StepResult]) -> str:
    if any(r.returncode for r in results):
        return ", ".join(cell(r) for r in results)
    seconds = [r.seconds for r in results]
    return f"{statistics.median(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f})"


def repeated_table(baseline: list[StepResult], current: list[StepResult]) -> str:
    """`make test` run in turn: each commit's median (range) and the median of the pairwise ratios."""
    pairs = list(zip(baseline, current, strict=True))
    passed = all(b.returncode == 0 and c.returncode == 0 for b, c in pairs)
    median_ratio = f"{statistics.median([b.seconds / c.seconds for b, c in pairs]):.2f}x" if passed else "n/a"
    return "\n".join([
        "| step | command | runs | baseline s, median (range) | current s, median (range) | baseline / current, median of pairs |",
        "|---|---|---:|---:|---:|---:|",
        (f"| test | `{' '.join(STEPS['test'])}` | {len(pairs)} | {repeated_cell(baseline)} | {repeated_cell(current)} "
         f"| {median_ratio} |"),
        "",
        "Pairs in the order they ran (baseline s, current s): "
        + "; ".join(f"{b.seconds:.1f}, {c.seconds:.1f}" for b, c in pairs),
    ])


def results_markdown(args: argparse.Namespace, commits: dict[str, str], table: str) -> str:
    machine = (
        f"{platform.node()}: {os.cpu_count()} CPUs ({cpu_signature()}), {platform.platform()}, "
        f"Python {platform.python_version()}"
    )
    cache = "empty pip and uv caches per clone" if args.cold_cache else "this machine's pip and uv caches as found"
    return (
        "# Default run: install, run, rerun and test from fresh clones\n\n"
        f"Command: `python -m benchmarks.default_run_benchmark {' '.join(sys.argv[1:])}`\n\n"
        f"- baseline: `{commits['baseline']}` ({args.baseline})\n"
        f"- current: `{commits['current']}` ({args.current})\n"
        f"- machine: {machine}\n- caches: {cache}\n"
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
        f"{table}\n"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="Commit to compare against")
    parser.add_argument("--current", default="HEAD", help="Commit to measure")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"Comma-separated subset of {', '.join(STEPS)}")
    parser.add_argument("--baseline-steps", help="Steps timed on the baseline (default: --steps)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="Run `make test` this many times, baseline and current in turn (steps install,test only)")
    parser.add_argument("--cold-cache", action="store_true", help="Empty pip and uv caches for each clone")
    parser.add_argument("--workdir", type=Path, help="Where the clones go (default: a new temp folder)")
    parser.add_argument("--keep", action="store_true", help="Keep the clones and step logs afterwards")
    parser.add_argument("--dry-run", action="store_true", help="Clone and check out, print the commands, run none")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="The markdown results file")
    args = parser.parse_args(argv)
    args.steps = [step.strip() for step in args.steps.split(",") if step.strip()]
    baseline_steps = args.baseline_steps.split(",") if args.baseline_steps is not None else args.steps
    args.baseline_steps = [step.strip() for step in baseline_steps if step.strip()]
    unknown = [step for step in args.steps + args.baseline_steps if step not in STEPS]
    if unknown:
        parser.error(f"unknown steps {unknown}; choose from {list(STEPS)}")
    repeated = set(args.steps + args.baseline_steps)
    if args.repeats < 1 or (args.repeats > 1 and ("test" not in repeated or not repeated <= {"install", "test"})):
        parser.error("--repeats N needs N >= 1, and above 1 the step test (with install or alone: both clones are "
                     "installed first either way)")
    return args


def prepare_clone(
    label: str, commit: str, workdir: Path, cold_cache: bool, commits: dict[str, str]
) -> tuple[Path, dict[str, str]]:
    """Clone `commit` into workdir/label (its full id recorded in `commits`); the clone and its environment."""
    clone = workdir / label
    commits[label] = clone_at(commit, clone)
    print(f"== {label}: {commits[label]} in {clone}", flush=True)
    return clone, clone_environment(clone, cold_cache)


def publish(args: argparse.Namespace, commits: dict[str, str], table: str) -> None:
    """Print the table and write it, with the commits and the machine, to --output."""
    print(f"\n{table}")
    args.output.write_text(results_markdown(args, commits, table))
    print(f"\nwritten to {args.output}")


def run_repeated(args: argparse.Namespace, workdir: Path, commits: dict[str, str]) -> int:
    """Install both clones, then `make test` --repeats times, baseline and current in turn."""
    clones: dict[str, tuple[Path, dict[str, str]]] = {}
    installs: dict[str, StepResult] = {}
    for label, commit in (("baseline", args.baseline), ("current", args.current)):
        clones[label] = prepare_clone(label, commit, workdir, args.cold_cache, commits)
        if args.dry_run:
            continue
        installs[label] = run_step("install", *clones[label], workdir)
        print(f"   install: {cell(installs[label])} s", flush=True)
        if installs[label].returncode:
            print(f"   install failed; its output ends with:\n{installs[label].tail}", flush=True)
            return 1
    if args.dry_run:
        print(f"   would run `make test` {args.repeats} times in each clone, baseline and current in turn")
        return 0
    runs: dict[str, list[StepResult]] = {"baseline": [], "current": []}
    for attempt in range(1, args.repeats + 1):
        for label in ("baseline", "current"):
            clone, env = clones[label]
            runs[label].append(run_step("test", clone, env, workdir, attempt))
            print(f"   test {attempt} {label}: {cell(runs[label][-1])} s", flush=True)
    publish(args, commits, repeated_table(runs["baseline"], runs["current"]))
    return 0 if all(r.returncode == 0 for per in runs.values() for r in per) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="default-run-benchmark-"))
    workdir.mkdir(parents=True, exist_ok=True)
    commits: dict[str, str] = {}
    results: dict[str, dict[str, StepResult]] = {"baseline": {}, "current": {}}
    try:
        if args.repeats > 1:
            return run_repeated(args, workdir, commits)
        for label, commit in (("baseline", args.baseline), ("current", args.current)):
            clone, env = prepare_clone(label, commit, workdir, args.cold_cache, commits)
            for step in args.baseline_steps if label == "baseline" else args.steps:
                if args.dry_run:
                    print(f"   would run: (cd {clone} && {' '.join(STEPS[step])})")
                    continue
                result = run_step(step, clone, env, workdir)
                results[label][step] = result
                print(f"   {step}: {cell(result)} s", flush=True)
                if result.returncode:
                    print(f"   {step} failed; its output ends with:\n{result.tail}", flush=True)
        if args.dry_run:
            return 0
        publish(args, commits, results_table(args.steps, results["baseline"], results["current"]))
        return 0 if all(r.returncode == 0 for per in results.values() for r in per.values()) else 1
    finally:
        if args.keep:
            print(f"clones and step logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
