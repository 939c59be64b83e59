"""The evaluation assets' metadata, one helper per asset: what `eval_arms` ran (slice, arms, best
single, cascades, conductor prompts, the routing W) and what `eval_tables` found (every table as
markdown, the W-router's figures, the plots), and the conductor check's result."""

from collections.abc import Sequence
from pathlib import Path

import dagster as dg

from assets.metadata import png_markdown
from conductor_pipeline.evaluation.arms import EvalRunSummary
from conductor_pipeline.evaluation.cascades import CascadeChoice
from conductor_pipeline.evaluation.eval_tables import EvalTables
from conductor_pipeline.evaluation.routers import BestSingleChoice
from resources.conductor import TRAINED_PROMPT_FIELDS, ConductorPolicyResource

CONDUCTOR_CHECK = "conductor_beats_best_single"


def eval_arms_metadata(
    summary: EvalRunSummary, calibration: BestSingleChoice, cascades: Sequence[CascadeChoice],
    conductors: Sequence[ConductorPolicyResource], world_model: dict[str, object],
) -> dict[str, object]:
    """The eval run: its slice, its arms, the best single worker chosen on the calibration questions,
    the agreement cascades chosen on the train split, how each conductor is prompted, the routing W."""
    return {
        "run_id": summary.run_id,
        "pool": summary.extra["pool"],
        "planned_slice_size": summary.planned_size,
        "slice_size": len(summary.slice_ids),
        "slice_order": summary.extra["order"],
        "restricted_to_recorded": summary.extra["restricted_to_recorded"],
        "split_fingerprint": summary.split_fingerprint,
        "repeats": summary.repeats,
        "arms": dg.MetadataValue.json(list(summary.arms)),
        "best_single_worker": calibration.worker,
        "calibration_questions": len(calibration.calibration_question_ids),
        "calibration_accuracies": dg.MetadataValue.json(calibration.accuracies),
        "agreement_cascades": dg.MetadataValue.json([choice.metadata() for choice in cascades]),
        "conductor_prompts": dg.MetadataValue.json({
            c.arm_label: {
                "model": c.model_path or c.model, **{f: getattr(c, f) for f in TRAINED_PROMPT_FIELDS},
                "max_new_tokens": c.effective_max_new_tokens,
            }
            for c in conductors
        }),
        **world_model,
    }


def eval_tables_metadata(eval_arms: EvalRunSummary, results: EvalTables, out_dir: Path) -> dict[str, object]:
    """Every eval table as markdown (verdicts, conductor pairs, costs, routing, usage, gaps), the
    W-router's figures as numbers and the two plots."""
    return {
        "run_id": eval_arms.run_id,
        "n_scored": results.n_common,
        "planned_slice_size": eval_arms.planned_size,
        "n_label": results.table["n_label"][0] if results.table.height else "n=0",
        "split_fingerprint": eval_arms.split_fingerprint,
        **{key: dg.MetadataValue.md(text) for key, text in results.markdown.items()},
        **routing_metadata(results.routing),
        "accuracy_vs_cost_plot": png_markdown(results.accuracy_png, "accuracy vs cost per arm"),
        "running_gap_plot": png_markdown(results.gap_png, "running gap to the best single worker"),
        "tables_dir": dg.MetadataValue.path(str(out_dir)),
    }


def routing_metadata(routing: dict | None) -> dict[str, dg.MetadataValue]:
    """The W-router's accuracy and the share of the oracle headroom it recovers, as numbers."""
    if routing is None:
        return {}
    metadata = {"w_router_accuracy": dg.MetadataValue.float(round(routing["accuracy"], 4))}
    if routing["headroom_recovered"] is not None:  # no headroom (oracle = best single): no share to report
        metadata["w_router_headroom_recovered"] = dg.MetadataValue.float(round(routing["headroom_recovered"], 4))
    return metadata


def conductor_check_result(verdicts: dict[str, str]) -> dg.AssetCheckResult:
    """Passes when a conductor arm beats the best single worker by the paired interval; a warning."""
    phrase = {"beats": "beats", "ties": "ties with", "loses": "loses to"}
    if not verdicts:
        description = "no conductor arm was evaluated"
    else:
        description = "; ".join(f"{arm} {phrase.get(v, v)} the best single worker" for arm, v in verdicts.items())
    return dg.AssetCheckResult(
        check_name=CONDUCTOR_CHECK,
        passed=any(verdict == "beats" for verdict in verdicts.values()),
        severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata={"verdicts": dg.MetadataValue.json(verdicts)},
    )
