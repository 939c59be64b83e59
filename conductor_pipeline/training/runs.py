"""One GRPO run of the conductor on its pool: prompt rows, the reward, one `training_steps` row per
optimizer step, and progress lines a person can follow (a CPU step takes seconds, a GPU step minutes).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from conductor_pipeline.training.dataset import TrainingSet
from conductor_pipeline.training.grpo import TrainingOutcome, checkpoint_step, last_checkpoint, train_grpo
from conductor_pipeline.training.reward import make_conductor_reward
from conductor_pipeline.training.rollouts import PoolExecutor
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.warehouse import Warehouse, load_sql

# Progress lines at most this often (a CPU step takes about a second, a GPU step minutes).
PROGRESS_LOG_INTERVAL_S = 10.0


def format_metric(value: object, digits: int = 3) -> str:
    """A logged figure for a progress line or summary: '-' when absent or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def training_steps_row(run_id: str, phase: str, row: Mapping) -> dict:
    """A `training_steps` row from a `step_row` dict (TRL's logs plus our parse-code tally).

    When the reward did not log a parse-failure rate, it is derived from the tally: failures over
    scored rollouts (infrastructure failures are not scored, so they are left out of both).
    """
    counts = dict(row.get("parse_code_counts") or {})
    fail_rate = row.get("parse_fail_rate")
    if fail_rate is None and counts:
        scored = sum(n for code, n in counts.items() if code != "infrastructure")
        fail_rate = (scored - counts.get("ok", 0)) / scored if scored else None
    return {
        "run_id": run_id,
        "step": int(row["step"]),
        "phase": phase,
        "reward_mean": row.get("reward_mean"),
        "reward_std": row.get("reward_std"),
        "frac_zero_std": row.get("frac_zero_std"),
        "parse_fail_rate": fail_rate,
        "parse_codes": json.dumps(counts, sort_keys=True),
        "group_size": row.get("group_size"),
        "completion_length": row.get("completion_length_mean"),
        "loss": row.get("loss"),
        "learning_rate": row.get("learning_rate"),
        "infra_excluded": row.get("infra_fail_rate"),
    }


def parse_code_totals(parse_codes: Iterable[str | None]) -> dict[str, int]:
    """Rollout outcomes summed over a run's `training_steps.parse_codes` (JSON objects, one per step)."""
    totals: dict[str, int] = {}
    for raw in parse_codes:
        for code, n in (json.loads(raw) if raw else {}).items():
            totals[code] = totals.get(code, 0) + n
    return totals


def forget_steps_after_checkpoint(store: Warehouse, run_id: str, output_dir: Path) -> int:
    """Delete the `training_steps` rows a killed run logged past its last checkpoint (a resumed run
    recomputes those steps); returns the step it will resume from."""
    resume_step = checkpoint_step(last_checkpoint(output_dir))
    with store.connect() as con:
        con.execute(load_sql("delete_training_steps_after"), {"run_id": run_id, "step": resume_step})
    return resume_step


def run_pool_grpo(
    model_path: Path | str,
    training: TrainingSet,
    executor: PoolExecutor,
    settings: GRPOSettings,
    output_dir: Path,
    *,
    run_id: str,
    phase: str,
    resume: bool,
    log: Callable[[str], object],
    time_limit_s: float | None = None,
) -> TrainingOutcome:
    """GRPO on the training set with rollouts executed against the pool; one warehouse row per step.

    Stops early (with a checkpoint) once `time_limit_s` has passed; `log` gets the progress lines.
    """
    rows = training.prompt_rows(settings)
    reward = make_conductor_reward(
        executor, settings.reward_variant, cost_weight=settings.cost_weight, group_size=settings.num_generations,
        bonus_weight=settings.world_model_bonus_weight,
    )
    started = time.monotonic()
    last_log = [0.0]
    first_step: list[int] = []

    def on_step(step: dict) -> bool:
        training.store.insert("training_steps", [training_steps_row(run_id, phase, step)])
        first_step[:1] = first_step[:1] or [step["step"]]
        elapsed = time.monotonic() - started
        done = step["step"] - first_step[0] + 1
        if elapsed - last_log[0] >= PROGRESS_LOG_INTERVAL_S or step["step"] >= settings.max_steps:
            last_log[0] = elapsed
            log(
                f"{phase} {run_id}: step {step['step']}/{settings.max_steps} ({elapsed / done:.1f} s/step); "
                f"reward {format_metric(step.get('reward_mean'))}, zero-std groups {format_metric(step.get('frac_zero_std'))} "
                f"(group size {settings.num_generations}), parse failures {format_metric(step.get('parse_fail_rate'))}"
            )
        return bool(time_limit_s and elapsed > time_limit_s)

    log(
        f"{phase} {run_id}: {len(rows)} prompts, {settings.questions_per_step} questions x "
        f"{settings.num_generations} rollouts per step, {settings.max_steps} steps, output {output_dir}"
    )
    return train_grpo(model_path, rows, reward, settings, output_dir, on_step=on_step, resume=resume)
