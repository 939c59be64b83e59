"""One GRPO run of the conductor on its pool: prompt rows, the reward, one `training_steps` row per
optimizer step, and progress lines a person can follow (a CPU step takes seconds, a GPU step minutes);
then what the run left: its rollout telemetry checked against its steps, and its first half of
steps against its second (parse failures, reward, where rollouts ended).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl
from tabulate import tabulate

from conductor_pipeline.conductor.hf_policy import policy_fingerprint
from conductor_pipeline.records import stable_id
from conductor_pipeline.training.dataset import TrainingSet
from conductor_pipeline.training.grpo import TrainingOutcome, checkpoint_step, last_checkpoint, train_grpo
from conductor_pipeline.training.reward import INFRASTRUCTURE, make_conductor_reward
from conductor_pipeline.training.rollouts import PoolExecutor
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.training.telemetry import (
    fan_out_counts,
    final_worker_counts,
    forget_rollouts_after,
    rollout_outcome_counts,
    rollout_row_counts,
    telemetry_mismatches,
)
from conductor_pipeline.warehouse import Warehouse, load_sql
from conductor_pipeline.workflow import PARSE_OK

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
        fail_rate = parse_fail_rate(counts)
    return {
        "run_id": run_id,
        "step": int(row["step"]),
        "phase": phase,
        "reward_mean": row.get("reward_mean"),
        "reward_std": row.get("reward_std"),
        "frac_zero_std": row.get("frac_zero_std"),
        "frac_groups_no_signal": row.get("frac_groups_no_signal"),
        "frac_same_correctness": row.get("frac_same_correctness"),
        "parse_fail_rate": fail_rate,
        "parse_codes": json.dumps(counts, sort_keys=True),
        "group_size": row.get("group_size"),
        "completion_length": row.get("completion_length_mean"),
        "loss": row.get("loss"),
        "learning_rate": row.get("learning_rate"),
        "infra_excluded": row.get("infra_fail_rate"),
    }


def parse_fail_rate(counts: Mapping[str, int]) -> float | None:
    """Unparseable rollouts over scored ones (infrastructure failures are not scored); None if none was."""
    scored = sum(n for code, n in counts.items() if code != INFRASTRUCTURE)
    return (scored - counts.get(PARSE_OK, 0)) / scored if scored else None


def parse_code_totals(parse_codes: Iterable[str | None]) -> dict[str, int]:
    """Rollout outcomes summed over a run's `training_steps.parse_codes` (JSON objects, one per step)."""
    totals: dict[str, int] = {}
    for raw in parse_codes:
        for code, n in (json.loads(raw) if raw else {}).items():
            totals[code] = totals.get(code, 0) + n
    return totals


@dataclass(frozen=True)
class HalfSummary:
    """One half of a run's optimizer steps: how its rollouts did and where they ended."""

    first_step: int
    last_step: int
    rollouts: int
    parse_fail_rate: float | None  # failures over scored rollouts (infrastructure failures left out)
    reward_mean: float | None  # mean of the steps' mean rewards (steps hold equal numbers of rollouts)
    same_correctness: float | None  # mean share of groups without a routing signal
    final_workers: dict[str, float]  # share of the half's rollouts ending at each worker ('(unparsed)' too)
    # Share of the half's rollouts (infrastructure failures left out) that fanned out to several
    # workers and aggregated them with a vote; None when the pool has no aggregator.
    fan_out_share: float | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def split_halves(
    steps: pl.DataFrame, final_workers: pl.DataFrame, fan_out: pl.DataFrame | None = None
) -> tuple[HalfSummary, HalfSummary] | None:
    """The first and the second half of a run's logged steps side by side (None below two steps):
    `steps` are its `training_steps` rows, `final_workers` its rollouts per step and final worker
    (`telemetry.final_worker_counts`), `fan_out` its fan-out-and-aggregate counts per step
    (`telemetry.fan_out_counts`; None when the pool has no aggregator)."""
    if steps.height < 2:
        return None
    ordered = steps.sort("step")
    middle = ordered.height // 2
    return _half(ordered[:middle], final_workers, fan_out), _half(ordered[middle:], final_workers, fan_out)


def _half(steps: pl.DataFrame, final_workers: pl.DataFrame, fan_out: pl.DataFrame | None) -> HalfSummary:
    first, last = int(steps["step"][0]), int(steps["step"][-1])
    codes = parse_code_totals(steps["parse_codes"].to_list())
    ended = final_workers.filter(pl.col("step").is_between(first, last)).group_by("final_worker").agg(pl.col("rollouts").sum())
    total = int(ended["rollouts"].sum()) if ended.height else 0
    return HalfSummary(
        first_step=first,
        last_step=last,
        rollouts=sum(codes.values()),
        parse_fail_rate=parse_fail_rate(codes),
        reward_mean=_mean(steps["reward_mean"]),
        same_correctness=_mean(steps["frac_same_correctness"]) if "frac_same_correctness" in steps.columns else None,
        final_workers={row["final_worker"]: row["rollouts"] / total for row in ended.sort("final_worker").iter_rows(named=True)},
        fan_out_share=None if fan_out is None else fan_out_share(fan_out.filter(pl.col("step").is_between(first, last))),
    )


def fan_out_share(fan_out: pl.DataFrame) -> float | None:
    """Fanned-out rollouts over all rollouts of `fan_out` (`telemetry.fan_out_counts` rows); None without rollouts."""
    rollouts = int(fan_out["rollouts"].sum()) if fan_out.height else 0
    return int(fan_out["fan_out"].sum()) / rollouts if rollouts else None


def _mean(column: pl.Series) -> float | None:
    values = column.cast(pl.Float64).fill_nan(None).drop_nulls()
    return float(values.mean()) if values.len() else None


def halves_markdown(first: HalfSummary, second: HalfSummary) -> str:
    """The two halves as two small tables: the rollout figures, then the final-worker shares."""
    header = [f"steps {first.first_step}-{first.last_step}", f"steps {second.first_step}-{second.last_step}"]
    figures = [
        ("rollouts", first.rollouts, second.rollouts),
        ("parse-failure rate", format_metric(first.parse_fail_rate), format_metric(second.parse_fail_rate)),
        ("mean reward", format_metric(first.reward_mean), format_metric(second.reward_mean)),
        ("groups without routing signal", format_metric(first.same_correctness), format_metric(second.same_correctness)),
    ]
    if first.fan_out_share is not None or second.fan_out_share is not None:
        figures.append(
            ("fan out and aggregate", format_metric(first.fan_out_share), format_metric(second.fan_out_share))
        )
    workers = sorted(set(first.final_workers) | set(second.final_workers))
    shares = [
        (worker, format_metric(first.final_workers.get(worker, 0.0)), format_metric(second.final_workers.get(worker, 0.0)),
         f"{second.final_workers.get(worker, 0.0) - first.final_workers.get(worker, 0.0):+.3f}")
        for worker in workers
    ]
    return (
        tabulate(figures, headers=["", *header], tablefmt="github", disable_numparse=True)
        + "\n\nShare of rollouts ending at each worker:\n\n"
        + tabulate(shares, headers=["final worker", *header, "change"], tablefmt="github", disable_numparse=True)
    )


@dataclass(frozen=True)
class RunTelemetry:
    """What a training or probe run left in the warehouse, read back for its asset's metadata."""

    steps: pl.DataFrame  # its `training_steps` rows
    final_workers: pl.DataFrame  # rollouts per step and final worker
    rows: dict[str, int]  # workflows / conductor_calls / step_calls
    mismatches: dict[int, dict[str, dict[str, int]]]  # steps whose workflows disagree with training_steps
    halves: tuple[HalfSummary, HalfSummary] | None
    fan_out: pl.DataFrame | None = None  # per step: rollouts and fan-out-and-aggregate ones (None: no aggregator)


def run_telemetry(store: Warehouse, run_id: str, aggregators: Collection[str] = ()) -> RunTelemetry:
    """A run's steps, rollout rows and their agreement: per step, the outcome counts of its
    `workflows` rows must equal `training_steps.parse_codes`. With `aggregators` (the pool's vote
    seats), also the share of rollouts per step that fanned out and aggregated."""
    steps = store.query_file("training_steps_of_run", {"run_id": run_id})
    logged = {int(row["step"]): json.loads(row["parse_codes"] or "{}") for row in steps.iter_rows(named=True)}
    final_workers = final_worker_counts(store, run_id)
    fan_out = fan_out_counts(store, run_id, aggregators)
    return RunTelemetry(
        steps=steps,
        final_workers=final_workers,
        rows=rollout_row_counts(store, run_id),
        mismatches=telemetry_mismatches(logged, rollout_outcome_counts(store, run_id)),
        halves=split_halves(steps, final_workers, fan_out),
        fan_out=fan_out,
    )


def forget_steps_after_checkpoint(store: Warehouse, run_id: str, output_dir: Path) -> int:
    """Delete the `training_steps` rows and the rollouts a killed run logged past its last
    checkpoint (a resumed run recomputes those steps); returns the step it will resume from."""
    resume_step = checkpoint_step(last_checkpoint(output_dir))
    with store.connect() as con:
        con.execute(load_sql("delete_training_steps_after"), {"run_id": run_id, "step": resume_step})
    forget_rollouts_after(store, run_id, resume_step)
    return resume_step


# Steps averaged at each end of a run for its reward trend.
TREND_WINDOW = 10


def progress_figures(steps: Sequence[Mapping], elapsed_s: float, settings: GRPOSettings) -> dict[str, object]:
    """Where a running GRPO run stands, from the step rows it logged in this process: its step,
    rollouts per second, and the reward and parsed accuracy over its first and its latest steps."""
    window = min(TREND_WINDOW, len(steps))

    def mean(rows: Sequence[Mapping], key: str) -> float | None:
        values = [float(v) for r in rows if (v := r.get(key, r.get("trl_logs", {}).get(key))) is not None]
        values = [v for v in values if not math.isnan(v)]
        return sum(values) / len(values) if values else None

    accuracy = "conductor/parsed_accuracy"
    return {
        "step": int(steps[-1]["step"]),
        "max_steps": settings.max_steps,
        "rollouts_per_s": len(steps) * settings.rollouts_per_step / max(elapsed_s, 1e-9),
        "window": window,
        "reward_first": mean(steps[:window], "reward_mean"),
        "reward_recent": mean(steps[-window:], "reward_mean"),
        "parsed_accuracy_first": mean([s["trl_logs"] for s in steps[:window]], accuracy),
        "parsed_accuracy_recent": mean([s["trl_logs"] for s in steps[-window:]], accuracy),
        "parse_fail_rate": steps[-1].get("parse_fail_rate"),
    }


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
    progress: Callable[[dict], object] | None = None,
) -> TrainingOutcome:
    """GRPO on the training set with rollouts executed against the pool; one warehouse row per step.

    The rollouts the executor records (`PoolExecutor.write_rows`) and the step rows are written
    with each progress line, before each checkpoint and when the run ends, not every step: a write
    opens the DuckDB file and checkpoints it, which cost a tenth of a tiny-model step when paid
    every step. Stops early (with a checkpoint) once `time_limit_s` has passed; `log` gets the progress
    lines and `progress` the same figures as a dict (`progress_figures`), at most every
    PROGRESS_LOG_INTERVAL_S and at the last step.
    """
    rows = training.prompt_rows(settings)
    reward = make_conductor_reward(
        executor, settings.reward_variant, cost_weight=settings.cost_weight, group_size=settings.num_generations,
        bonus_weight=settings.world_model_bonus_weight,
    )
    started = time.monotonic()
    last_log = [0.0]
    history: list[dict] = []
    unwritten_steps: list[dict] = []

    def write_rows() -> None:
        """Everything held: the rollouts, then the step rows (a step's row lands after its rollouts)."""
        executor.write_rows()
        if unwritten_steps:
            training.store.insert("training_steps", unwritten_steps)
            unwritten_steps.clear()

    def on_step(step: dict) -> bool:
        unwritten_steps.append(training_steps_row(run_id, phase, step))
        history.append(step)
        elapsed = time.monotonic() - started
        if elapsed - last_log[0] >= PROGRESS_LOG_INTERVAL_S or step["step"] >= settings.max_steps:
            last_log[0] = elapsed
            write_rows()
            figures = progress_figures(history, elapsed, settings)
            log(
                f"{phase} {run_id}: step {figures['step']}/{settings.max_steps}, {figures['rollouts_per_s']:.1f} "
                f"rollouts/s; reward {format_metric(figures['reward_first'])} over the first {figures['window']} steps "
                f"-> {format_metric(figures['reward_recent'])} over the last {figures['window']}; parsed accuracy "
                f"{format_metric(figures['parsed_accuracy_recent'])}, parse failures "
                f"{format_metric(step.get('parse_fail_rate'))}, zero-std groups {format_metric(step.get('frac_zero_std'))} "
                f"(group size {settings.num_generations})"
            )
            if progress is not None:
                progress(figures)
        return bool(time_limit_s and elapsed > time_limit_s)

    log(
        f"{phase} {run_id}: {len(rows)} prompts, {settings.questions_per_step} questions x "
        f"{settings.num_generations} rollouts per step, {settings.max_steps} steps, output {output_dir}"
    )
    try:
        return train_grpo(
            model_path, rows, reward, settings, output_dir, on_step=on_step, before_checkpoint=write_rows,
            resume=resume, log=log, aggregators=training.pool_config.vote_seat_names,
        )
    finally:
        write_rows()  # the steps and rollouts since the last write


# Settings that say how long a run is and how often it saves, not what it learns: left out of its key.
RUN_LENGTH_SETTINGS = ("max_steps", "save_steps", "save_total_limit")
# Settings added after runs were recorded, with the value that does what every run did before: at
# that value they are left out of the key, so a recorded run keeps its key (and resumes).
LATER_SETTINGS_AT_OLD_BEHAVIOUR = {"constrained_decoding": False, "fan_outs_only": False, "max_pool_size": None}


def policy_name(model: Path | str) -> str:
    """A policy as `workflows.conductor` names it: its folder (or hub id) name."""
    return f"policy:{Path(str(model)).name}"


def run_recipe(settings: GRPOSettings) -> dict[str, Any]:
    """The settings that make a GRPO run what it is: all but its length, and but the later settings
    left at the behaviour every run had before them."""
    old_behaviour = LATER_SETTINGS_AT_OLD_BEHAVIOUR.items()
    return {k: v for k, v in settings.describe().items() if k not in RUN_LENGTH_SETTINGS and (k, v) not in old_behaviour}


def grpo_run_key(
    settings: GRPOSettings, training: TrainingSet, start_policy: Path | str, *, naming: str, n_examples: int,
    contested_subpools: bool,
) -> str:
    """What a GRPO run is made of: its settings but its length (a longer run of the same recipe
    continues the shorter one), how its prompts show the pool, the pool file, the questions it
    trains on and the weights it starts from. A run keyed the same resumes; any other starts afresh."""
    ranked = ["ranked"] if training.ranked else []  # joins the key only when on: older runs keep theirs
    return stable_id(
        run_recipe(settings), naming, n_examples, contested_subpools, training.pruning,
        training.predicted_success, *ranked,
        training.pool_config.model_dump_json(), sorted(q.question_id for q in training.questions),
        policy_fingerprint(start_policy),
    )[:16]


def balance_markdown(balance: Mapping) -> str:
    """The warm start's choices against uniform picks within each catalogue, by position and by worker."""
    lines = [f"Parsed parse-check samples: {balance['rollouts']}. Observed (expected with no preference):"]
    for part in ("by_position", "by_worker"):
        test = balance[part]
        cells = ", ".join(f"{k}: {test['observed'][k]} ({test['expected'][k]})" for k in test["observed"])
        p = "n/a" if test["p_value"] is None else f"{test['p_value']:.3f}"
        lines.append(f"- {part.replace('_', ' ')}: {cells}; chi-square p = {p}")
    return "\n".join(lines)


def rollout_summary(telemetry: RunTelemetry) -> str:
    """Parse failures and reward over all of a run's rollouts, and first half against second half."""
    codes = parse_code_totals(telemetry.steps["parse_codes"].to_list())
    overall = f"Parse failures over all {sum(codes.values())} rollouts: {format_metric(parse_fail_rate(codes))}"
    if telemetry.halves is None:
        return overall + "."
    first, second = telemetry.halves
    return (
        f"{overall} (first half {format_metric(first.parse_fail_rate)}, second half {format_metric(second.parse_fail_rate)}); "
        f"mean reward {format_metric(first.reward_mean)} -> {format_metric(second.reward_mean)}."
    )
