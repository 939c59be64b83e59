"""The training assets' metadata: tables, pruning, the probe's audit, rollout telemetry and a run's
curves, as Dagster metadata values."""

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import dagster as dg
from tabulate import tabulate

from assets.metadata import png_markdown
from conductor_pipeline.files import write_bytes_atomic
from conductor_pipeline.training.dataset import TrainingSet
from conductor_pipeline.training.plots import training_curves_png
from conductor_pipeline.training.runs import RunTelemetry, fan_out_share, halves_markdown, parse_code_totals
from conductor_pipeline.training.telemetry import rollout_row_counts
from conductor_pipeline.warehouse import Warehouse


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
