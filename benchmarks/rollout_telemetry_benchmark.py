"""Rollout telemetry: what recording every rollout costs a GRPO step, with and without, side by side.

Target: recording rollouts (a `workflows` row per rollout, `calls` rows for the conductor and each
executed step, held in memory and written before each checkpoint) slows a training step by at
most 10%. The steps are the CPU profile's (the tiny conductor after its warm start, so most
rollouts parse and execute worker steps) on the embedded replay pool.

Two measurements, because a machine shared with other jobs makes step times jump several-fold:
- paired (the figure the target is judged on): one GRPO run whose reward scores every batch with
  both executors, recorded and not, in alternating order, timing each; the cost of telemetry per
  step is the difference plus the time of the warehouse writes, against the step time of an
  unrecorded step (the paired step less the recorded scoring). Both arms see the same load.
- side by side: whole runs with and without telemetry, alternating, median wall and CPU time per
  step (each run's first step, which loads the model, left out). Noisy on a busy machine.

    .venv/bin/python -m benchmarks.rollout_telemetry_benchmark [--steps 8] [--rounds 1] [--save-steps 2] [--work-dir DIR] [--model DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from conductor_pipeline.corpora.loaders import load_gsm8k
from conductor_pipeline.paths import ARTIFACTS_DIR
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.splits import split_of
from conductor_pipeline.training.dataset import TrainingSet
from conductor_pipeline.training.grpo import train_grpo
from conductor_pipeline.training.reward import REWARD_FUNC_NAME, AsyncConductorReward, make_conductor_reward
from conductor_pipeline.training.rollouts import PoolExecutor
from conductor_pipeline.training.runs import run_pool_grpo, run_telemetry
from conductor_pipeline.training.settings import CPU_POLICY_HIDDEN_SIZE, CPU_POLICY_LAYERS, GRPOSettings, SFTSettings
from conductor_pipeline.training.sft import warm_start_sft
from conductor_pipeline.training.synthetic import warm_start_pairs
from conductor_pipeline.training.telemetry import RolloutLog, RowBuffer, rollout_row_counts
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.warehouse import Warehouse

POOL = "replay-mixed6"
QUESTIONS = 32
TARGET_OVERHEAD = 0.10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps per run (the first is left out)")
    parser.add_argument("--rounds", type=int, default=1, help="side-by-side runs per arm, alternating (0: paired only)")
    parser.add_argument("--work-dir", type=Path, default=ARTIFACTS_DIR / "benchmarks" / "rollout_telemetry")
    parser.add_argument("--model", type=Path, help="a warm-started conductor to use (default: warm-start one in --work-dir)")
    parser.add_argument("--save-steps", type=int, default=2,
                        help="checkpoint (and write the held rows) every N steps; the CPU profile's is 10, so 2 is the harsh case")
    args = parser.parse_args()

    pool = load_pool(POOL)
    questions = [q for q in load_gsm8k("test") if split_of(q.question_id) == "train"][:QUESTIONS]
    settings = GRPOSettings.cpu_profile(max_steps=args.steps, save_steps=args.save_steps)
    model = args.model or warm_started_tiny_model(args.work_dir, pool, questions, settings)
    workers = build_workers(pool)
    overhead = paired_overhead(model, pool, workers, questions, settings)
    if args.rounds:
        side_by_side(model, pool, workers, questions, settings, args.rounds)
    return 0 if overhead <= TARGET_OVERHEAD else 1


class PairedReward:
    """A TRL reward that scores each batch with both executors' rewards (the order alternating by
    step), timing each; the trainer gets the recorded one's rewards."""

    __name__ = REWARD_FUNC_NAME

    def __init__(self, recorded: AsyncConductorReward, unrecorded: AsyncConductorReward) -> None:
        self.rewards = {"with": recorded, "without": unrecorded}
        self.seconds: dict[str, list[float]] = {"with": [], "without": []}

    async def __call__(self, **kwargs):
        order = ["with", "without"] if len(self.seconds["with"]) % 2 == 0 else ["without", "with"]
        results = {}
        for arm in order:
            started = time.perf_counter()
            results[arm] = await self.rewards[arm](**kwargs)
            self.seconds[arm].append(time.perf_counter() - started)
        assert results["with"] == results["without"], "recording changed a reward"
        return results["with"]

    def drain_counts(self) -> dict[str, int]:
        self.rewards["without"].drain_counts()
        return self.rewards["with"].drain_counts()


def paired_overhead(model: Path, pool, workers, questions, settings: GRPOSettings) -> float:
    """The telemetry's share of an unrecorded step, measured within one run (see the module doc)."""
    with tempfile.TemporaryDirectory() as scratch:
        store = Warehouse(Path(scratch) / "bench.duckdb")
        store.insert("questions", questions)
        recorded = PoolExecutor(pool, workers, questions, "ordinal", log=RolloutLog(RowBuffer(store), "bench", "grpo", "policy:bench"))
        unrecorded = PoolExecutor(pool, workers, questions, "ordinal")
        reward = PairedReward(*(make_conductor_reward(e, group_size=settings.num_generations) for e in (recorded, unrecorded)))
        writes: list[float] = []

        def write_rows() -> None:
            started = time.perf_counter()
            recorded.write_rows()
            writes.append(time.perf_counter() - started)

        rows = TrainingSet(pool, store, questions).prompt_rows(settings)
        outcome = train_grpo(model, rows, reward, settings, Path(scratch) / "grpo", before_checkpoint=write_rows)
        write_rows()
        telemetry_rows = rollout_row_counts(store, "bench")
    steps = [row["step_seconds"] for row in outcome.steps][1:]
    with_, without = reward.seconds["with"][1:], reward.seconds["without"][1:]
    unrecorded_steps = sum(step - scoring for step, scoring in zip(steps, with_, strict=True))
    cost = sum(with_) - sum(without) + sum(writes)
    overhead = cost / unrecorded_steps
    n = len(steps)
    print(f"paired, {n} steps of {settings.rollouts_per_step} rollouts ({sum(telemetry_rows.values())} rows written "
          f"in {len(writes)} writes): per step, unrecorded step {unrecorded_steps / n:.3f} s; scoring "
          f"{sum(without) / n:.3f} s unrecorded vs {sum(with_) / n:.3f} s recorded; writes {sum(writes) / n:.3f} s")
    print(f"  telemetry overhead {overhead:+.1%} of an unrecorded step (target <= {TARGET_OVERHEAD:.0%})", flush=True)
    return overhead


def side_by_side(model: Path, pool, workers, questions, settings: GRPOSettings, rounds: int) -> None:
    """Whole runs with and without telemetry, alternating; median wall and CPU seconds per step."""
    step_times: dict[str, list[float]] = {"without telemetry": [], "with telemetry": []}
    cpu_times: dict[str, list[float]] = {arm: [] for arm in step_times}
    for round_index in range(rounds):
        for arm in step_times:
            with tempfile.TemporaryDirectory() as scratch:
                store = Warehouse(Path(scratch) / "bench.duckdb")
                store.insert("questions", questions)
                training = TrainingSet(pool, store, questions)
                log = RolloutLog(RowBuffer(store), f"bench-{round_index}", "grpo", "policy:bench") if arm == "with telemetry" else None
                executor = PoolExecutor(pool, workers, questions, training.naming, log=log)
                steps = run_pool_grpo(
                    model, training, executor, settings, Path(scratch) / "grpo", run_id=log.run_id if log else "bench",
                    phase="grpo", resume=False, log=lambda _: None,
                ).steps
                if log is not None:
                    assert not run_telemetry(store, log.run_id).mismatches
            times = [row["step_seconds"] for row in steps]
            step_times[arm] += times[1:]
            cpu_times[arm] += [row["step_cpu_seconds"] for row in steps][1:]
            print(f"round {round_index + 1} {arm}: {', '.join(f'{t:.2f}' for t in times)} s/step (wall)", flush=True)
    print(f"side by side, median over {len(step_times['with telemetry'])} steps per arm:")
    for clock, table in (("wall", step_times), ("cpu", cpu_times)):
        without, with_ = (statistics.median(table[arm]) for arm in table)
        print(f"  {clock:4}  without telemetry {without:.3f} s    with telemetry {with_:.3f} s    ({with_ / without - 1:+.1%})")


def warm_started_tiny_model(work_dir: Path, pool, questions, settings: GRPOSettings) -> Path:
    """The CPU profile's tiny conductor after its warm start (cached in `work_dir`), so rollouts parse."""
    base = build_tiny_causal_lm(work_dir / "tiny", hidden_size=CPU_POLICY_HIDDEN_SIZE, num_layers=CPU_POLICY_LAYERS)
    rows = TrainingSet(pool, Warehouse(work_dir / "unused.duckdb"), questions).prompt_rows(settings)
    pairs = warm_start_pairs(rows, n=256, seed=1, style="compact")
    started = time.monotonic()
    out = warm_start_sft(base, pairs, SFTSettings.cpu_profile(), work_dir / "warm_start")
    print(f"warm start ready in {time.monotonic() - started:.0f}s: {out}", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
