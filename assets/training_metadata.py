"""The training assets' metadata, one helper per stage (the contested set, the parse check and the
warm start, the probe, the checkpoint) built from tables, pruning, the probe's audit, rollout
telemetry and a run's curves."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import dagster as dg
import polars as pl
from tabulate import tabulate

from assets.metadata import png_markdown
from conductor_pipeline.files import write_bytes_atomic
from conductor_pipeline.probing.contested import ContestedRule, ContestedSelection, pass_rate_histogram
from conductor_pipeline.splits import split_fingerprint
from conductor_pipeline.training.dataset import TrainingSet
from conductor_pipeline.training.gates import GateVerdict
from conductor_pipeline.training.grpo import TrainingOutcome
from conductor_pipeline.training.plots import sft_loss_png, training_curves_png
from conductor_pipeline.training.recipe import Recipe
from conductor_pipeline.training.runs import (
    RunTelemetry,
    balance_markdown,
    fan_out_share,
    format_metric,
    halves_markdown,
    parse_code_totals,
    rollout_summary,
    run_telemetry,
)
from conductor_pipeline.training.sft import final_loss, read_sft_history
from conductor_pipeline.training.stages import GRPORun, ParseCheck, WarmStartRun
from conductor_pipeline.training.synthetic import MAX_FAN_OUT
from conductor_pipeline.training.telemetry import rollout_row_counts
from conductor_pipeline.warehouse import Warehouse

NO_FLIPS_NOTE = "n/a: one recording per question (a one-sample probe IS the probe here)"


def md_table(rows: Sequence[Sequence], headers: Sequence[str]) -> dg.MetadataValue:
    return dg.MetadataValue.md(tabulate(rows, headers=headers, tablefmt="github"))


def pruning_metadata(training: TrainingSet) -> dict[str, dg.MetadataValue]:
    if training.pruning is None:
        return {"world_model_pruning": dg.MetadataValue.text("off")}
    return {
        "world_model_pruning": dg.MetadataValue.json(training.pruning),
        "pruned_questions": dg.MetadataValue.int(len(training.skipped)),
    }


def probe_audit_metadata(manifest: Mapping | None) -> dict[str, dg.MetadataValue]:
    """The probe's audit of world-model pruning, repeated on the checkpoint it licensed."""
    audit = (manifest or {}).get("world_model_pruning")
    return {"probe_pruning_audit": dg.MetadataValue.json(audit)} if audit else {}


def telemetry_metadata(store: Warehouse, run_id: str) -> dict[str, dg.MetadataValue]:
    """What a run's rollouts left in `workflows` and `calls`."""
    return {"rollout_telemetry": dg.MetadataValue.json({"run_id": run_id, **rollout_row_counts(store, run_id)})}


def run_metadata(
    telemetry: RunTelemetry, run_id: str, title: str, png_path: Path, threshold: float | None,
    report_error: Callable[[str], object],
) -> dict[str, dg.MetadataValue]:
    """A GRPO or probe run's curves, its first half against its second, and its rollout telemetry
    checked against its `training_steps` rows (a mismatch is logged as an error); on a pool with an
    aggregator, the share of rollouts that fanned out and aggregated, per step and per half."""
    frame = telemetry.steps
    if frame.is_empty():
        return {}
    halves = tuple(half.as_dict() for half in telemetry.halves) if telemetry.halves is not None else None
    png = training_curves_png(frame, title, threshold, telemetry.final_workers, halves, telemetry.fan_out)
    write_bytes_atomic(png_path, png, "training curves")
    last = frame.row(-1, named=True)
    codes = parse_code_totals(frame["parse_codes"].to_list())
    if telemetry.mismatches:
        report_error(f"{run_id}: rollout rows in `workflows` disagree with training_steps.parse_codes: {telemetry.mismatches}")
    metadata = {
        "curves": png_markdown(png, title),
        "curves_path": dg.MetadataValue.path(str(png_path)),
        "steps_logged": dg.MetadataValue.int(frame.height),
        "last_reward_mean": dg.MetadataValue.float(float(last["reward_mean"] or 0.0)),
        "last_parse_fail_rate": dg.MetadataValue.float(float(last["parse_fail_rate"] or 0.0)),
        "parse_code_counts": md_table(sorted(codes.items(), key=lambda kv: -kv[1]), ["outcome", "rollouts"]),
        "rollout_telemetry": dg.MetadataValue.json(
            {"run_id": run_id, **telemetry.rows, "matches_training_steps": not telemetry.mismatches}
        ),
    }
    if telemetry.halves is not None:
        first, second = telemetry.halves
        metadata["learning"] = dg.MetadataValue.md(halves_markdown(first, second))
        metadata["halves"] = dg.MetadataValue.json({"first": first.as_dict(), "second": second.as_dict()})
    if telemetry.fan_out is not None:
        halves_share = {} if telemetry.halves is None else {
            "first_half": telemetry.halves[0].fan_out_share, "second_half": telemetry.halves[1].fan_out_share,
        }
        metadata["fan_out_share"] = dg.MetadataValue.json({
            "overall": fan_out_share(telemetry.fan_out), **halves_share,
            "per_step": {int(row["step"]): row["fan_out"] / row["rollouts"] for row in telemetry.fan_out.iter_rows(named=True)},
        })
    return metadata


# --- one helper per stage ----------------------------------------------------------------------


def contested_metadata(
    pool_name: str, selection: ContestedSelection, rule: ContestedRule, rates: pl.DataFrame, min_size: int,
    table_path: Path, manifest_path: Path,
) -> dict[str, dg.MetadataValue]:
    """The contested set: its size against the floor, the rule as resolved, why each question is in
    it, and the pass rates it was chosen from."""
    histogram = pass_rate_histogram(rates)
    reasons = selection.questions.group_by("reason").len().sort("reason")
    samples = rates["samples"]
    flips = selection.one_sample_flips
    return {
        "pool": dg.MetadataValue.text(pool_name),
        "size": dg.MetadataValue.int(selection.questions.height),
        "min_size": dg.MetadataValue.int(min_size),
        "rule": dg.MetadataValue.json({**rule.as_dict(), "weak_resolved": selection.weak, "strong_resolved": selection.strong}),
        "counts_per_class": md_table(list(selection.counts.items()), ["class", "questions"]),
        "counts_per_reason": md_table(reasons.rows(), ["reason", "questions"]),
        "one_sample_flips": (
            dg.MetadataValue.text(NO_FLIPS_NOTE) if flips is None
            else md_table(sorted(flips.items()), ["one-sample -> k-sample class", "questions"])
        ),
        "pool_mean_pass_rate_histogram": md_table(histogram.rows(), histogram.columns),
        "samples_per_pair": dg.MetadataValue.text(f"min {samples.min()}, max {samples.max()}"),
        "split_fingerprint": dg.MetadataValue.text(split_fingerprint()),
        "split": dg.MetadataValue.text("train only"),
        "table_path": dg.MetadataValue.path(str(table_path)),
        "manifest_path": dg.MetadataValue.path(str(manifest_path)),
    }


def parse_check_metadata(check: ParseCheck, training: TrainingSet) -> dict[str, dg.MetadataValue]:
    """The policy the warm start starts from, its parse check, and the training set's pruning."""
    return {
        "base_policy": dg.MetadataValue.text(str(check.model)),
        "device": dg.MetadataValue.text(check.device),
        "parse_rate_before": dg.MetadataValue.float(check.rate),
        "parse_codes_before": dg.MetadataValue.json(check.codes),
        "parse_check": dg.MetadataValue.text(f"{check.prompts} prompts x {check.samples} samples, temperature 1"),
        **pruning_metadata(training),
    }


def warm_start_metadata(
    warm: WarmStartRun, after: ParseCheck, recipe: Recipe, choice_balance: dict, elapsed_s: float
) -> dict[str, dg.MetadataValue]:
    """The warm start (`after`: its SFT model's parse check): its model, its synthetic pairs and SFT
    loss, and what its samples parse to and pick (`choice_balance`)."""
    settings, history = recipe.warm_start, read_sft_history(warm.model)
    metadata = {
        "model_path": dg.MetadataValue.path(str(warm.model)),
        "warm_start": dg.MetadataValue.bool(True),
        "parse_rate_after": dg.MetadataValue.float(after.rate),
        "parse_codes_after": dg.MetadataValue.json(after.codes),
        "synthetic_pairs": dg.MetadataValue.int(warm.pairs),
        "synthetic_style": dg.MetadataValue.text(settings.style),
        "fan_out_warm_start": dg.MetadataValue.bool(settings.fan_out),
        "max_fan_out": dg.MetadataValue.int(settings.max_fan_out or MAX_FAN_OUT[settings.style]),
        "sft_steps": dg.MetadataValue.int(recipe.sft.max_steps),
        "final_loss": dg.MetadataValue.float(final_loss(history)),
        "sft_elapsed_s": dg.MetadataValue.float(round(warm.sft_elapsed_s, 1)),
        "elapsed_s": dg.MetadataValue.float(round(elapsed_s, 1)),
        "choice_balance": dg.MetadataValue.json(choice_balance),
        "choice_balance_summary": dg.MetadataValue.md(balance_markdown(choice_balance)),
    }
    png = sft_loss_png(history)
    if png is not None:
        metadata["loss_curve"] = png_markdown(png, "SFT loss")
    return metadata


@dataclass(frozen=True)
class StageRun:
    """One finished GRPO stage (the probe or the training itself), as its metadata reads it."""

    grpo: GRPORun
    title: str  # of its curves
    recipe: Recipe
    training: TrainingSet
    elapsed_s: float
    curves_path: Path

    @cached_property
    def telemetry(self) -> RunTelemetry:
        return run_telemetry(self.training.store, self.grpo.run_id, self.training.pool_config.vote_seat_names)

    def curves(self, report_error: Callable[[str], object]) -> dict[str, dg.MetadataValue]:
        return run_metadata(
            self.telemetry, self.grpo.run_id, self.title, self.curves_path, self.recipe.gate.zero_variance_threshold,
            report_error,
        )


def probe_metadata(
    run: StageRun, manifest: Mapping, preview: GateVerdict, report_error: Callable[[str], object]
) -> dict[str, dg.MetadataValue]:
    """The zero-variance probe (its `manifest`): how many of its groups were flat, against the gate's threshold."""
    gate, settings = run.recipe.gate, run.grpo.settings
    steps, pruning = len(manifest["steps"]), manifest.get("world_model_pruning")
    summary = (
        f"{steps} probe steps in {run.elapsed_s:.0f}s: {preview.reward_figure:.3f} of {preview.groups} groups "
        f"(group size {settings.num_generations}; the paper's is 64) had zero reward variance and "
        f"{format_metric(preview.correctness_figure)} the same correctness in every rollout (no routing signal); "
        f"the gate judges {preview.gate_on} and needs < {gate.zero_variance_threshold:.2f}{preview.describe_interval()}. "
        f"{rollout_summary(run.telemetry)}"
    )
    return {
        "summary": dg.MetadataValue.text(summary),
        "probe_run_id": dg.MetadataValue.text(run.grpo.run_id),
        "zero_variance_fraction": dg.MetadataValue.float(preview.figure),
        "zero_variance_interval": dg.MetadataValue.json({"low": preview.interval[0], "high": preview.interval[1]}
                                                        if preview.interval else {}),
        "probe_decided": dg.MetadataValue.bool(bool(preview.decided)),
        "flat_reward_fraction": dg.MetadataValue.float(preview.reward_figure),
        "same_correctness_fraction": (
            dg.MetadataValue.float(preview.correctness_figure) if preview.correctness_figure is not None
            else dg.MetadataValue.text("not measured")
        ),
        "gate_on": dg.MetadataValue.text(preview.gate_on),
        "group_size": dg.MetadataValue.int(settings.num_generations),
        "groups": dg.MetadataValue.int(preview.groups),
        "threshold": dg.MetadataValue.float(gate.zero_variance_threshold),
        "steps": dg.MetadataValue.int(steps),
        "elapsed_s": dg.MetadataValue.float(round(run.elapsed_s, 1)),
        "seconds_per_step": dg.MetadataValue.float(round(run.elapsed_s / max(steps, 1), 2)),
        "settings": dg.MetadataValue.json(settings.describe()),
        "device": dg.MetadataValue.text(run.grpo.device),
        "contested_subpools": dg.MetadataValue.bool(run.recipe.data.contested_subpools),
        "world_model_pruning": dg.MetadataValue.json(pruning) if pruning else dg.MetadataValue.text("off"),
        **({"pruned_questions": dg.MetadataValue.int(len(run.training.skipped))} if pruning else {}),
        **run.curves(report_error),
    }


def checkpoint_metadata(
    run: StageRun, outcome: TrainingOutcome, verdict: GateVerdict, probe_manifest: Mapping | None,
    report_error: Callable[[str], object],
) -> dict[str, dg.MetadataValue]:
    """The trained checkpoint: where it is, how far GRPO got, the gate that licensed it, its curves."""
    resumed = f", resumed from {outcome.resumed_from.name}" if outcome.resumed_from else ""
    return {
        "checkpoint_path": dg.MetadataValue.path(str(outcome.checkpoint_dir)),
        "checkpoint": dg.MetadataValue.text(
            f"{outcome.checkpoint_dir} (group size {outcome.group_size}, {run.elapsed_s:.0f}s{resumed})"
        ),
        "global_step": dg.MetadataValue.int(outcome.global_step),
        "step": dg.MetadataValue.int(outcome.global_step),
        "resumed_from": dg.MetadataValue.text(str(outcome.resumed_from) if outcome.resumed_from else "none"),
        "stopped_early": dg.MetadataValue.bool(outcome.stopped_early),
        "group_size": dg.MetadataValue.int(outcome.group_size),
        "training_run_id": dg.MetadataValue.text(run.grpo.run_id),
        "tensorboard_logdir": dg.MetadataValue.path(str(run.curves_path.parent / "runs")),
        "elapsed_s": dg.MetadataValue.float(round(run.elapsed_s, 1)),
        "gate": dg.MetadataValue.json(verdict.summary()),
        "settings": dg.MetadataValue.json(run.grpo.settings.describe()),
        "device": dg.MetadataValue.text(run.grpo.device),
        **pruning_metadata(run.training),
        **probe_audit_metadata(probe_manifest),
        **run.curves(report_error),
    }
