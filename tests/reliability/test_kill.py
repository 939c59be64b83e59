"""Kill tests: SIGKILL the materializing process at random points, rerun, and nothing is lost or doubled.

Probing: `dagster asset materialize --select probe_calls` (the CLI, its step process and the
grading workers: the whole process group) against the fault server with latency, killed at five
random points (one during start-up, four at random row counts), then run to the end. The
warehouse must hold exactly the row keys of an uninterrupted run, once each.

Training: GRPO on the tiny model (`tests/reliability/train_driver.py`, a checkpoint every step)
killed at five random points (a random moment after a random step, so some kills land inside a
checkpoint save), then run to the end. Each rerun must continue from the last complete
checkpoint (its first step is that checkpoint's step + 1), and the checkpoint directory must end
with one complete checkpoint per step.

Both are slow (about 5 + 5 minutes on two shared cores): RUN_SLOW=1. A fast test checks that
a checkpoint killed mid-save (no trainer state yet) is never resumed from. Set KILL_SEED to replay a particular schedule.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.soak import synthetic_questions, write_pool_file
from tests.fakes import FaultKind, FaultRates, FaultServer
from conductor_pipeline.paths import PROJECT_ROOT
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.probing.runner import run_probes
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.warehouse import Warehouse
from tests.reliability.dagster_cli import CLI_TIMEOUT_S, dagster_env, start_materialize

SEED = int(os.environ.get("KILL_SEED", str(random.SystemRandom().randrange(10_000))))
SEATS = ("w0", "w1")
N_QUESTIONS = 60
SAMPLES = 2
TOTAL_CALLS = len(SEATS) * N_QUESTIONS * SAMPLES
LATENCY_S = 0.3  # with 8 calls in flight: ~10 s of probing, long enough to kill inside
# Windows (fractions of all calls written) in which the four row-count kills land.
ROW_KILL_WINDOWS = [(0.05, 0.2), (0.25, 0.4), (0.45, 0.6), (0.65, 0.85)]
POLL_S = 0.2
# Each killed run is read for two steps (to time a step on this machine), then killed within the
# next 1.5 step-times: at most 4 steps per kill, 20 for five, leaving steps for the final run.
TRAIN_MAX_STEPS = 24
TRAIN_KILLS = 5
FAULTS = FaultRates.spread(0.10, [FaultKind.RATE_LIMIT, FaultKind.SERVER_ERROR, FaultKind.RESET, FaultKind.TRUNCATED])
PROBE_CONFIG = {"ops": {"probe_calls": {"config": {"samples": SAMPLES, "corpora": ["synthetic"], "batch_size": 10}}}}


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process and everything it started (it runs in its own session)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def probe_rows(warehouse: Warehouse, pool: str) -> int:
    return int(warehouse.query("SELECT count(*) AS n FROM calls WHERE pool = $pool", {"pool": pool})["n"][0])


def row_keys(warehouse: Warehouse, pool: str) -> tuple[list[str], int]:
    frame = warehouse.query(
        "SELECT call_id, question_id, worker, sample FROM calls WHERE pool = $pool AND kind = 'probe'", {"pool": pool}
    )
    natural = frame.select("question_id", "worker", "sample").unique().height
    return sorted(frame["call_id"].to_list()), natural


def uninterrupted_keys(tmp_path: Path, pool_path: Path, questions: list) -> list[str]:
    """The same probe, run once in-process without interruption, into its own warehouse."""
    pool = load_pool(pool_path)
    reference = Warehouse(tmp_path / "reference.duckdb")

    async def go() -> None:
        workers = build_workers(pool)
        try:
            await run_probes(reference, pool, workers, questions, samples=SAMPLES, temperature=0.2,
                             run_id="reference", governor=Governor.from_pool(pool))
        finally:
            for worker in workers.values():
                await worker.aclose()

    asyncio.run(go())
    keys, _ = row_keys(reference, pool.name)
    return keys


@pytest.mark.slow
def test_probe_killed_at_five_random_points_ends_as_if_never_killed(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    warehouse_path = tmp_path / "warehouse.duckdb"
    store = Warehouse(warehouse_path)
    questions = synthetic_questions(N_QUESTIONS, prefix="kill", corpus="synthetic")
    store.insert("questions", questions)
    kills: list[str] = []
    with FaultServer(latency_s=LATENCY_S, faults=FAULTS, retry_after_s=0.05, seed=SEED) as server:
        pool_path = write_pool_file(tmp_path / "pool.yaml", server.base_url, name="kill-pool", seats=SEATS,
                                    concurrency=4, retry={"max_attempts": 3, "base_delay_s": 0.01, "max_delay_s": 0.1})
        env = dagster_env(tmp_path / "dagster_home", warehouse_path, pool_path)

        def launch(index: int) -> subprocess.Popen:
            return start_materialize("probe_calls", env, partition_range=f"{SEATS[0]}...{SEATS[-1]}",
                                     run_config=PROBE_CONFIG, log_path=tmp_path / f"run{index}.log")

        # Kill 1: a random moment of start-up or the first calls.
        process = launch(0)
        time.sleep(rng.uniform(3.0, 15.0))
        rows_before = probe_rows(store, "kill-pool")
        kill_group(process)
        kills.append(f"{rows_before}/{TOTAL_CALLS} rows (random start-up moment)")
        # Kills 2-5: once a random number of rows (within each window) is written.
        for index, (low, high) in enumerate(ROW_KILL_WINDOWS, start=1):
            target = int(TOTAL_CALLS * rng.uniform(low, high))
            process = launch(index)
            deadline = time.monotonic() + CLI_TIMEOUT_S
            while probe_rows(store, "kill-pool") < target:
                assert process.poll() is None, f"run {index} ended before row {target}: " + (
                    tmp_path / f"run{index}.log").read_text()[-3000:]
                assert time.monotonic() < deadline
                time.sleep(POLL_S)
            time.sleep(rng.uniform(0.0, 1.0))  # not always right after a batch write
            kill_group(process)
            kills.append(f"{probe_rows(store, 'kill-pool')}/{TOTAL_CALLS} rows (threshold {target})")
        final = launch(len(ROW_KILL_WINDOWS) + 1)
        code = final.wait(timeout=CLI_TIMEOUT_S)
        assert code == 0, (tmp_path / f"run{len(ROW_KILL_WINDOWS) + 1}.log").read_text()[-4000:]
        server.configure(latency_s=0.0)
        expected = uninterrupted_keys(tmp_path, pool_path, questions)
    print(f"\nprobe kill points (seed {SEED}): {kills}")

    keys, natural = row_keys(store, "kill-pool")
    assert len(expected) == TOTAL_CALLS
    assert keys == expected  # same row keys as an uninterrupted run: nothing lost
    assert natural == len(keys) == len(set(keys))  # and nothing written twice
    assert len(kills) >= 5


# --- training ------------------------------------------------------------------------------------


def complete_checkpoints(out_dir: Path) -> dict[int, Path]:
    """Checkpoints whose manifest verifies (written once the Trainer has saved every file)."""
    from conductor_pipeline.training.grpo import checkpoint_problem

    found = {}
    for path in out_dir.glob("checkpoint-*"):
        if checkpoint_problem(path) is None:
            found[int(path.name.rsplit("-", 1)[1])] = path
    return found


def simulate_kill_mid_save(out_dir: Path, complete_step: int) -> Path:
    """`checkpoint-<complete_step + 1>` as a kill between the weights and the trainer state leaves it."""
    partial = out_dir / f"checkpoint-{complete_step + 1}"
    partial.mkdir(exist_ok=True)
    (partial / "trainer_state.json").unlink(missing_ok=True)
    (partial / "model.safetensors").write_bytes(b"half-written")
    return partial


def fake_checkpoint(out_dir: Path, step: int, *, sealed: bool) -> Path:
    """A checkpoint folder as the Trainer leaves it (weights, then trainer state), sealed or not."""
    from conductor_pipeline.training.grpo import seal_checkpoint

    path = out_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"weights" * 100)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if sealed:
        seal_checkpoint(path, step)
    return path


def test_a_checkpoint_killed_mid_save_is_not_resumed_from(tmp_path: Path) -> None:
    from conductor_pipeline.training.grpo import last_checkpoint, seal_checkpoint

    complete = fake_checkpoint(tmp_path, 2, sealed=True)
    # numeric order, not lexical: a complete 10 would win; every file written but not yet sealed
    unsealed = fake_checkpoint(tmp_path, 10, sealed=False)
    simulate_kill_mid_save(tmp_path, 2)
    assert last_checkpoint(tmp_path) == complete
    seal_checkpoint(unsealed, 10)
    assert last_checkpoint(tmp_path) == unsealed


def test_a_truncated_checkpoint_is_skipped_saying_which_file(tmp_path: Path) -> None:
    """A complete checkpoint damaged afterwards (a truncated weights file) is never resumed from:
    the latest whole one is, and the log line names the damaged file."""
    from conductor_pipeline.training.grpo import last_checkpoint

    whole = fake_checkpoint(tmp_path, 10, sealed=True)
    damaged = fake_checkpoint(tmp_path, 20, sealed=True)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    lines: list[str] = []
    assert last_checkpoint(tmp_path, lines.append) == whole
    assert len(lines) == 1 and str(weights) in lines[0] and "truncated" in lines[0]
    weights.write_bytes(b"x" * len(b"weights" * 100))  # same size, other bytes: the hash tells
    lines.clear()
    assert last_checkpoint(tmp_path, lines.append) == whole
    assert str(weights) in lines[0] and "sha256" in lines[0]


def read_steps(process: subprocess.Popen, until_step: int | None, timeout_s: float) -> list[tuple[int, float]]:
    """(step, monotonic time seen) for each STEP line, until `until_step` is seen (or the process ends)."""
    assert process.stdout is not None
    steps: list[tuple[int, float]] = []
    deadline = time.monotonic() + timeout_s
    for line in process.stdout:
        if line.startswith("STEP "):
            steps.append((int(line.split()[1]), time.monotonic()))
            if until_step is not None and steps[-1][0] >= until_step:
                break
        assert time.monotonic() < deadline, "training driver too slow"
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["cpu", "cpu-paper"])
def test_training_killed_at_five_random_points_resumes_from_the_last_checkpoint(tmp_path: Path, profile: str) -> None:
    """Both CPU profiles' trainers (the default's, and the paper budget's shared-prompt path at its
    shape: groups of 64, 4 questions a step) checkpoint and resume the same way."""
    rng = random.Random(SEED)
    model = build_tiny_causal_lm(tmp_path / "model")
    out_dir = tmp_path / "grpo"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    argv = [sys.executable, "-u", "-m", "tests.reliability.train_driver", str(model), str(out_dir),
            "--max-steps", str(TRAIN_MAX_STEPS), "--save-steps", "1", "--profile", profile]

    def launch(index: int) -> subprocess.Popen:
        stderr = (tmp_path / f"train{index}.err").open("wb")
        return subprocess.Popen(argv, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                start_new_session=True)

    kills: list[str] = []
    partial_seen: list[str] = []
    for index in range(TRAIN_KILLS):
        resume_step = max(complete_checkpoints(out_dir), default=0)
        process = launch(index)
        steps = read_steps(process, resume_step + 2, CLI_TIMEOUT_S)  # two steps: one step-time to scale by
        assert len(steps) == 2, (tmp_path / f"train{index}.err").read_text()[-3000:]
        assert steps[0][0] == resume_step + 1, f"run {index} started at step {steps[0][0]}, last checkpoint {resume_step}"
        # A step takes 0.1 s on a quiet box and seconds under load: scale the random moment by the
        # step just measured so the kill lands mid-step or mid-save either way.
        step_s = steps[1][1] - steps[0][1]
        delay = rng.uniform(0.0, 1.5) * step_s
        time.sleep(delay)
        kill_group(process)
        kills.append(f"after step {steps[-1][0]} + {delay:.2f}s (step {step_s:.2f}s)")
        partial_seen += [p.name for p in out_dir.glob("checkpoint-*") if p not in complete_checkpoints(out_dir).values()]
    resume_step = max(complete_checkpoints(out_dir), default=0)
    # A kill inside a checkpoint save is a narrow window: leave what it leaves (weights written,
    # trainer state not yet) for the next step, so the final run must skip it every time.
    simulate_kill_mid_save(out_dir, resume_step)
    final = launch(TRAIN_KILLS)
    steps = read_steps(final, None, CLI_TIMEOUT_S)
    assert final.wait(timeout=60) == 0, (tmp_path / f"train{TRAIN_KILLS}.err").read_text()[-3000:]
    print(f"\ntraining kill points (seed {SEED}): {kills}; partial checkpoints seen after kills: {partial_seen}")

    assert steps and steps[0][0] == resume_step + 1 and steps[-1][0] == TRAIN_MAX_STEPS
    checkpoints = complete_checkpoints(out_dir)
    assert sorted(checkpoints) == list(range(1, TRAIN_MAX_STEPS + 1))
    assert sorted(p.name for p in out_dir.glob("checkpoint-*")) == sorted(p.name for p in checkpoints.values())
    for step, path in checkpoints.items():
        assert json.loads((path / "trainer_state.json").read_text())["global_step"] == step
        assert (path / "model.safetensors").is_file()
