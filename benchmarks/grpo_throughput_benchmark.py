"""GRPO rollouts per second on the CPU: TRL's own path and the shared-prompt path, side by side.

    .venv/bin/python -m benchmarks.grpo_throughput_benchmark [--steps 4] [--group 64] [--questions 4]

Both paths train the same warm-started tiny policy on the same contested prompts with the project's
reward (each rollout parsed, executed on the replay pool, graded, and recorded as telemetry in a copy
of the warehouse), at the paper's shape by default: groups of 64, 4 questions a step, temperature
1.0. "today" is TRL's GRPOTrainer as the project called it before (every rollout's prompt run
through the policy to sample and again in the loss, micro-batches of 8); "shared" is
`SharedPromptGRPOTrainer` (each prompt once, one micro-batch a step). Each path takes one warm-up
step, then `--steps` timed steps; `--rounds` repeats both, alternating, on a noisy machine.

Per path it prints seconds per step split into generation (sampling and decoding the rollouts), the
reward (parsing, executing and grading every rollout, and its telemetry rows), the loss's forward
and backward passes, and the rest (TRL's own work: batching, advantages, logging, the optimizer
step); then rollouts per second, the ratio of the two paths, and what the paper's 51,200 rollouts
(200 steps x 4 questions x 64) would take. Parsing alone is timed by parsing the recorded
completions again after the run.

It reads a finished default run (`make run`): the warehouse, the contested set and the warm start
under the artifacts root (`CORYPHAEUS_ARTIFACTS`, default artifacts/), copied, never written.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from conductor_pipeline.paths import artifacts_root
from conductor_pipeline.reproducibility import DEFAULT_TORCH_THREADS, make_reproducible

PAPER_ROLLOUTS = 200 * 4 * 64
PHASES = ("generation", "reward", "loss forward", "loss backward")


@dataclass
class PathTiming:
    """One path's timed steps: wall seconds per step and seconds per phase per step."""

    name: str
    rollouts_per_step: int
    step_seconds: list[float]
    phase_seconds: dict[str, list[float]]
    parse_seconds_per_step: float

    @property
    def seconds_per_step(self) -> float:
        return statistics.median(self.step_seconds)

    @property
    def rollouts_per_second(self) -> float:
        return self.rollouts_per_step / self.seconds_per_step

    def phase(self, name: str) -> float:
        return statistics.median(self.phase_seconds[name])


def _timed(record: Callable[[float], None], function: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            record(time.perf_counter() - started)

    return wrapper


def run_path(name: str, settings, source: Path, workdir: Path, steps: int) -> PathTiming:
    """`steps` timed GRPO steps (after one warm-up step) of one path, on a copy of the source warehouse."""
    from transformers import TrainerCallback

    from conductor_pipeline.conductor.prompt import displayed_worker_names, read_trained_prompt
    from conductor_pipeline.pools.backends.registry import build_workers
    from conductor_pipeline.pools.config import load_pool
    from conductor_pipeline.training.dataset import build_training_set
    from conductor_pipeline.training.grpo import build_grpo_trainer
    from conductor_pipeline.training.reward import make_conductor_reward
    from conductor_pipeline.training.rollouts import PoolExecutor
    from conductor_pipeline.training.telemetry import RolloutLog, RowBuffer
    from conductor_pipeline.training.trl_extensions import labelled_positions_only
    from conductor_pipeline.warehouse import Warehouse
    from conductor_pipeline.workflow import parse_code

    run_dir = workdir / name
    run_dir.mkdir(parents=True)
    shutil.copy2(source / "warehouse.duckdb", run_dir / "warehouse.duckdb")
    store = Warehouse(run_dir / "warehouse.duckdb")
    pool = load_pool(POOL)
    warm_start = source / "training" / POOL / "warm_start"
    trained = read_trained_prompt(warm_start)
    naming = trained.naming if trained else "ordinal"  # as the warm start was trained
    training = build_training_set(store, pool, source / "contested_set", naming=naming, n_examples=0, contested_subpools=True)
    workers = build_workers(pool, [seat.name for seat in pool.workers if not seat.is_conductor])
    executor = PoolExecutor(
        pool, workers, training.questions, naming, max_new_tokens=settings.max_completion_length,
        log=RolloutLog(RowBuffer(store), f"bench-{name}", "grpo", "policy:bench"),
    )
    reward = make_conductor_reward(executor, settings.reward_variant, group_size=settings.num_generations)
    phases: dict[str, list[float]] = defaultdict(list)
    current: dict[str, float] = defaultdict(float)
    step_ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())
            for phase in PHASES:
                phases[phase].append(current.pop(phase, 0.0))
            return control

    def add(phase: str) -> Callable[[float], None]:
        return lambda seconds: current.__setitem__(phase, current[phase] + seconds)

    settings = replace(settings, max_steps=steps + 1, save_steps=10**6)
    trainer = build_grpo_trainer(
        warm_start, training.prompt_rows(settings), reward, settings, run_dir / "grpo",
        callbacks=[StepClock()],
    )
    trainer._generate = _timed(add("generation"), trainer._generate)
    trainer._calculate_rewards = _timed(add("reward"), trainer._calculate_rewards)
    trainer.compute_loss = _timed(add("loss forward"), trainer.compute_loss)
    trainer.accelerator.backward = _timed(add("loss backward"), trainer.accelerator.backward)
    started = time.perf_counter()
    with labelled_positions_only():
        trainer.train()
    executor.write_rows()
    bounds = [started, *step_ends]
    seconds = [b - a for a, b in zip(bounds, bounds[1:], strict=False)][1:]  # the warm-up step left out
    completions = store.query(
        "SELECT raw_text, catalogue FROM workflows WHERE run_id = $run AND training_step > 1", {"run": f"bench-{name}"}
    )
    parse_started = time.perf_counter()
    for raw_text, catalogue in completions.iter_rows():
        parse_code(raw_text, displayed_worker_names(list(catalogue), naming))
    parse_seconds = (time.perf_counter() - parse_started) / max(steps, 1)
    return PathTiming(
        name, settings.rollouts_per_step, seconds, {p: v[1:] for p, v in phases.items()}, parse_seconds
    )


def report(timings: list[PathTiming]) -> str:
    """The side-by-side table: seconds per step by phase, rollouts per second, and the ratio."""
    lines = ["| path | s / step | generation | reward (parse) | loss forward | loss backward | rest (TRL) | "
             "rollouts / s | 51,200 rollouts |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in timings:
        rest = t.seconds_per_step - sum(t.phase(p) for p in PHASES)
        paper_minutes = PAPER_ROLLOUTS / t.rollouts_per_second / 60
        lines.append(
            f"| {t.name} | {t.seconds_per_step:.2f} | {t.phase('generation'):.2f} | {t.phase('reward'):.2f} "
            f"({t.parse_seconds_per_step:.3f}) | {t.phase('loss forward'):.2f} | {t.phase('loss backward'):.2f} | "
            f"{rest:.2f} | {t.rollouts_per_second:.1f} | {paper_minutes:.1f} min |"
        )
    by_name = {t.name: t for t in timings}
    if {"today", "shared"} <= set(by_name):
        ratio = by_name["shared"].rollouts_per_second / by_name["today"].rollouts_per_second
        lines.append(f"\nshared / today: **{ratio:.2f}x** the rollouts per second (medians over the timed steps)")
    return "\n".join(lines)


POOL = "replay-mixed6"


def main(argv: list[str] | None = None) -> int:
    from conductor_pipeline.training.settings import GRPOSettings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=None, help="a finished run's artifacts root")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per path (after one warm-up step)")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the two paths this many times")
    parser.add_argument("--group", type=int, default=64, help="rollouts per question (the paper's 64)")
    parser.add_argument("--questions", type=int, default=4, help="questions per step (the paper's 4)")
    parser.add_argument("--paths", nargs="+", default=["today", "shared"], choices=["today", "shared"])
    parser.add_argument("--torch-threads", type=int, default=DEFAULT_TORCH_THREADS)
    args = parser.parse_args(argv)
    make_reproducible(torch_threads=args.torch_threads)
    source = args.source or artifacts_root()
    warm_start = source / "training" / POOL / "seed-0" / "warm_start"
    if not (source / "warehouse.duckdb").is_file() or not warm_start.is_dir():
        parser.error(f"no finished default run under {source} (warehouse, {warm_start.relative_to(source)}): run `make run`")
    shape = GRPOSettings.cpu_profile(num_generations=args.group, questions_per_step=args.questions)
    settings = {
        "today": replace(shape, share_prompt_prefix=False, per_device_train_batch_size=8),
        "shared": shape,
    }
    timings: dict[str, list[PathTiming]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="grpo-throughput-") as work:
        for round_index in range(args.rounds):
            for name in args.paths:
                timing = run_path(name, settings[name], source, Path(work) / f"{name}-{round_index}", args.steps)
                timings[name].append(timing)
                print(f"round {round_index + 1} {name}: {timing.seconds_per_step:.2f} s a step, "
                      f"{timing.rollouts_per_second:.1f} rollouts/s", flush=True)
    merged = [
        PathTiming(
            name, runs[0].rollouts_per_step, [s for r in runs for s in r.step_seconds],
            {p: [s for r in runs for s in r.phase_seconds[p]] for p in PHASES},
            statistics.median(r.parse_seconds_per_step for r in runs),
        )
        for name, runs in timings.items()
    ]
    print(f"\n{args.group} rollouts x {args.questions} questions a step, {args.steps} timed steps x {args.rounds} "
          f"rounds per path, {args.torch_threads} torch threads; seconds are medians per step\n")
    print(report(merged))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
