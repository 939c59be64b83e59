"""The conductor's training stages on a pool, each one call: the warm start between two parse checks,
the GRPO probe the zero-variance gate judges (run once for its inputs and read back after), and the
GRPO training run (resumed from its last checkpoint). The training assets call these; a GRPO stage is
one `GRPORun`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor_pipeline.training.dataset import TrainingSet, pruning_report
from conductor_pipeline.training.gates import RUN_MANIFEST, probe_manifest, read_probe_manifest, write_probe_manifest
from conductor_pipeline.training.grpo import TrainingOutcome, remove_checkpoints
from conductor_pipeline.training.recipe import Recipe
from conductor_pipeline.training.rollouts import PoolExecutor, parse_check
from conductor_pipeline.training.runs import forget_steps_after_checkpoint, policy_name, run_pool_grpo
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.training.sft import warm_start_sft
from conductor_pipeline.training.synthetic import warm_start_pairs
from conductor_pipeline.training.telemetry import (
    PARSE_CHECK_AFTER,
    PARSE_CHECK_BEFORE,
    RolloutLog,
    RowBuffer,
    forget_run,
)
from conductor_pipeline.workflow import PARSE_OK

PROBE_PHASE = "probe"
TRAINING_PHASE = "grpo"

@dataclass(frozen=True)
class ParseCheck:
    """A policy's parse check: what its samples at temperature 1 parse to."""

    model: Path | str
    device: str
    rate: float
    codes: dict[str, int]
    prompts: int
    samples: int

    @property
    def failures(self) -> dict[str, int]:
        return {code: n for code, n in self.codes.items() if code != PARSE_OK}


@dataclass(frozen=True)
class WarmStartRun:
    """The warm start: the base policy's parse check and, when the recipe's warm start is on, the
    SFT model from `pairs` synthetic pairs and its own parse check (else `model` is the base)."""

    before: ParseCheck
    model: Path | str
    after: ParseCheck | None
    pairs: int
    sft_elapsed_s: float


def warm_start_checked(
    base: Path | str,
    training: TrainingSet,
    recipe: Recipe,
    executor: PoolExecutor,
    output_dir: Path,
    *,
    check_run_id: str,
    device: str,
    log: Callable[[str], object],
) -> WarmStartRun:
    """SFT of `base` on synthetic valid workflows over the pool's workers (format only), with a parse
    check before and after. The checks sample exactly GRPO's prompts (same sub-pools, naming,
    examples), so the format learnt is the one scored; every sample is a rollout, executed on the
    pool and recorded under `check_run_id` (all written when this returns)."""
    warm, prompt = recipe.warm_start, recipe.prompt
    started = time.monotonic()
    rows = training.prompt_rows(recipe.grpo)
    check_rows = rows[: warm.parse_check_prompts]
    with RowBuffer(training.store) as writer:

        def check(model: Path | str, phase: str) -> ParseCheck:
            executor.log = RolloutLog(writer, check_run_id, phase, policy_name(model))
            rate, codes = parse_check(
                model, check_rows, prompt.naming, prompt.max_new_tokens, warm.parse_check_samples, executor=executor,
                device=device,
            )
            return ParseCheck(model, device, rate, codes, len(check_rows), warm.parse_check_samples)

        before = check(base, PARSE_CHECK_BEFORE)
        n_checked = len(check_rows) * warm.parse_check_samples
        log(f"base policy {base}: parse rate {before.rate:.2f} on {n_checked} samples")
        if not warm.enabled:
            log("warm start disabled: GRPO starts from the base policy")
            return WarmStartRun(before, base, None, 0, 0.0)
        pairs = warm_start_pairs(
            rows, n=warm.examples, seed=recipe.seed + 1, naming=prompt.naming, style=warm.style,
            aggregators=training.pool_config.vote_seat_names, fan_out_only=warm.fan_out, max_fan_out=warm.max_fan_out,
        )
        log(f"warm start: {len(pairs)} synthetic pairs ({warm.style} style), {recipe.sft.max_steps} SFT steps")
        sft_started = time.monotonic()
        model = warm_start_sft(base, pairs, recipe.sft, output_dir)
        sft_elapsed = time.monotonic() - sft_started
        after = check(model, PARSE_CHECK_AFTER)
    log(
        f"warm start done in {time.monotonic() - started:.0f}s: parse rate {before.rate:.2f} -> {after.rate:.2f} at "
        f"temperature 1 ({n_checked} samples; failures {after.failures}); model at {model}"
    )
    return WarmStartRun(before, model, after, len(pairs), sft_elapsed)


# The pool's rollouts of a stage, recorded under the log it is given.
ExecutorFor = Callable[[RolloutLog], PoolExecutor]


@dataclass(frozen=True)
class GRPORun:
    """One GRPO run of the conductor: its phase (`probe` or `grpo`), id, folder, start policy,
    settings and device. The id says what the run computes, so a rerun of the same inputs is the
    same run (the probe is read back, the training resumes)."""

    phase: str
    run_id: str
    output_dir: Path
    start_policy: Path | str
    settings: GRPOSettings
    device: str

    def rollout_log(self, writer: RowBuffer) -> RolloutLog:
        return RolloutLog(writer, self.run_id, self.phase, policy_name(self.start_policy))


def probe_once(
    run: GRPORun,
    training: TrainingSet,
    executor_for: ExecutorFor,
    *,
    prune_audit_questions: int,
    dagster_run_id: str,
    log: Callable[[str], object],
    progress: Callable[[dict], object] | None = None,
) -> dict[str, Any]:
    """The zero-variance probe of `run`'s inputs, as its manifest (steps, sizes, any world-model
    pruning): read back when a run of the same inputs finished, else run.

    An unfinished probe of the same inputs (a killed run) starts again from scratch, its rows
    deleted first, so its figures are an uninterrupted probe's. The probe's weights are not a
    product: its logs stay, its checkpoints (GBs on the GPU profile) go.
    """
    manifest = read_probe_manifest(run.output_dir, RUN_MANIFEST)
    if manifest is not None and len(manifest["steps"]) >= run.settings.max_steps:
        log(f"probe {run.run_id} of these inputs already finished (dagster run {manifest['dagster_run_id']})")
        return manifest
    forget_run(training.store, run.run_id)
    log(f"probe {run.run_id}: starting")
    with RowBuffer(training.store) as writer:
        executor = executor_for(run.rollout_log(writer))
        run_pool_grpo(
            run.start_policy, training, executor, run.settings, run.output_dir,
            run_id=run.run_id, phase=run.phase, resume=False, log=log, progress=progress,
        )
        pruning = pruning_report(run.start_policy, training, executor, run.settings, prune_audit_questions, run.device)
    if pruning is not None:
        log(f"world-model pruning: {pruning}")
    logged = training.store.query_file("training_steps_of_run", {"run_id": run.run_id}).iter_rows(named=True)
    manifest = probe_manifest(
        run.run_id, logged, group_size=run.settings.num_generations, groups_per_step=run.settings.questions_per_step,
        dagster_run_id=dagster_run_id, contested_questions=len(training.questions) + len(training.skipped),
        trained_questions=len(training.questions), world_model_pruning=pruning,
    )
    write_probe_manifest(run.output_dir, manifest, RUN_MANIFEST)
    remove_checkpoints(run.output_dir)
    return manifest


def train_resuming(
    run: GRPORun,
    training: TrainingSet,
    executor_for: ExecutorFor,
    *,
    time_limit_s: float | None,
    log: Callable[[str], object],
    progress: Callable[[dict], object] | None = None,
) -> TrainingOutcome:
    """GRPO of the conductor, resumed after the last checkpoint of `run` (the steps logged after it
    are deleted first, so a resumed run's rows are an uninterrupted run's)."""
    resume_step = forget_steps_after_checkpoint(training.store, run.run_id, run.output_dir)
    log(
        f"GRPO run {run.run_id}: " + (f"resuming after step {resume_step}" if resume_step else "starting at step 1")
        + " (a run of other settings, prompts, pool, questions or start policy gets another key); "
        + f"output {run.output_dir}"
    )
    with RowBuffer(training.store) as writer:
        return run_pool_grpo(
            run.start_policy, training, executor_for(run.rollout_log(writer)), run.settings, run.output_dir,
            run_id=run.run_id, phase=run.phase, resume=True, log=log, time_limit_s=time_limit_s, progress=progress,
        )
