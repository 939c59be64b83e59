"""SmolLM2-135M-Instruct as the conductor, prompted, warm-started and GRPO-trained, against the workers
on a fixed eval slice, through the project's own assets: a real pretrained model on a CPU.

Runs the graph stage by stage in a fresh Dagster instance and warehouse under --work-dir, with the
`cpu-smollm2` trainer profile on the embedded replay pool: the data (corpora, probes, pass rates,
contested set), the warm start (SFT on synthetic workflows, parse checks before and after), the
GRPO probe and its gate, GRPO training, and the evaluation, whose conductor arms are the untrained
model with the same prompt ("prompted"), the warm-started model and the GRPO checkpoint (sampled
at temperature 1 with the training cap on completion length). Writes the figures (parse rates
before and after the warm start and over GRPO, first against second half of each run's rollouts,
eval accuracies with 95% intervals, where each conductor's gap to the best single worker comes
from, wall time per stage) to a RESULTS file and prints them.

The gate is judged and reported at the project's threshold (strictly below 0.20 of groups with
equal rewards); training goes ahead unless every probe group was flat (--gate-threshold 1.0), so
the trained arm exists to be compared: the record says whether the project's gate would have
opened. A rerun with the same --work-dir reuses the probes, the warm start, the GRPO checkpoints and
the eval workflows already recorded (the GRPO probe runs again).

    .venv/bin/python -m benchmarks.smollm2_conductor              # the full run (see --help for sizes)
    .venv/bin/python -m benchmarks.smollm2_conductor --quick      # ~15 minutes: every path, tiny sizes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg

from assets.definitions import build_definitions, corpora_job, probe_job
from assets.main import is_blocking_check_failure
from assets.metadata import latest_metadata
from assets.probing import PROBE_CALLS, all_probe_partitions_tags
from conductor_pipeline.evaluation.arms import ConductorArm
from conductor_pipeline.paths import ARTIFACTS_DIR
from conductor_pipeline.stats import wilson_interval
from conductor_pipeline.training.gates import ZERO_VARIANCE_GATE, ZERO_VARIANCE_THRESHOLD
from conductor_pipeline.warehouse import Warehouse
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.trainer import SFTOverrides, TrainerResource
from resources.warehouse import WarehouseResource

POOL = "replay-mixed6"
PROMPTED_LABEL = "prompted"
RESULTS = Path(__file__).with_name("RESULTS-smollm2-conductor.md")
# Stage -> the assets one job materializes (their checks run with them).
STAGES: dict[str, list[str]] = {
    "data": ["pass_rates", "oracle_ceilings", "contested_set"],
    "warm_start": ["warm_start_policy"],
    "probe": ["grpo_probe_run"],
    "grpo": ["conductor_checkpoint"],
    "eval": ["eval_arms", "eval_tables"],
}
FULL = dict(sft_steps=40, sft_examples=256, probe_steps=8, grpo_steps=10, num_generations=4, questions_per_step=2,
            max_completion=128, parse_check_prompts=4, parse_check_samples=4, eval_size=128)
# Every path, the GRPO arm included: 12 warm-start steps make some sampled workflows parse, so a
# probe group of 4 usually varies and the gate (at --gate-threshold 1.0) lets training run.
QUICK = dict(sft_steps=12, sft_examples=48, probe_steps=2, grpo_steps=2, num_generations=4, questions_per_step=1,
             max_completion=128, parse_check_prompts=2, parse_check_samples=4, eval_size=4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=ARTIFACTS_DIR / "smollm2-conductor")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the RESULTS markdown is written")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks every path in minutes (the figures mean nothing)")
    for name, value in FULL.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=None, help=f"default {value} (quick: {QUICK[name]})")
    parser.add_argument("--gate-threshold", type=float, default=1.0,
                        help="train only if the probe's flat-group share is strictly below this (1.0: unless all flat)")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA rank for the warm start and GRPO (0: full fine-tuning)")
    args = parser.parse_args()
    sizes = {name: getattr(args, name) if getattr(args, name) is not None else (QUICK if args.quick else FULL)[name]
             for name in FULL}

    args.work_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DAGSTER_HOME", str((args.work_dir / "dagster_home").resolve()))
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    trainer = TrainerResource(
        profile="cpu-smollm2", output_root=str(args.work_dir / "training"),
        num_generations=sizes["num_generations"], questions_per_step=sizes["questions_per_step"],
        max_steps=sizes["grpo_steps"], max_completion_length=sizes["max_completion"], probe_steps=sizes["probe_steps"],
        sft_examples=sizes["sft_examples"], sft=SFTOverrides(max_steps=sizes["sft_steps"]),
        parse_check_prompts=sizes["parse_check_prompts"], parse_check_samples=sizes["parse_check_samples"],
        zero_variance_threshold=args.gate_threshold, lora_rank=args.lora_rank,
    )
    started = time.monotonic()
    base = Path(trainer.base_policy_path())  # fetch and convert SmolLM2 first: a clear error before any stage
    print(f"SmolLM2-135M-Instruct at {base} ({time.monotonic() - started:.0f}s)", flush=True)
    conductor = ConductorPolicyResource(
        model_path=str(base), label=PROMPTED_LABEL, n_examples=trainer.recipe().prompt.n_examples,
        naming=trainer.recipe().prompt.naming,
        max_new_tokens=sizes["max_completion"],
    )
    defs = experiment_definitions(args.work_dir, trainer, conductor)
    eval_config = {"slice_size": sizes["eval_size"], "world_model_router": False}
    timings: dict[str, float] = {}
    with dg.DagsterInstance.get() as instance:
        for stage in ["corpora", "probes", *STAGES]:
            stage_started = time.monotonic()
            outcome = run_stage(defs, stage, instance, eval_config)
            timings[stage] = time.monotonic() - stage_started
            print(f"== {stage}: {outcome} in {timings[stage]:.0f}s", flush=True)
            if outcome == "failed":
                print(f"stage {stage} failed: see its run in {os.environ['DAGSTER_HOME']}", file=sys.stderr)
                return 1
        report = experiment_report(instance, Warehouse(args.work_dir / "warehouse.duckdb"), sizes, timings, args)
    args.results.write_text(report)
    print(report)
    print(f"\nwritten to {args.results}")
    return 0


def experiment_definitions(work_dir: Path, trainer: TrainerResource, conductor: ConductorPolicyResource) -> dg.Definitions:
    """The project's definitions with this experiment's resources, plus one job per stage."""
    project = build_definitions(POOL)
    stage_jobs = [dg.define_asset_job(f"smollm2_{stage}", selection=assets) for stage, assets in STAGES.items()]
    return dg.Definitions(
        assets=project.assets,
        asset_checks=project.asset_checks,
        jobs=[corpora_job, probe_job, *stage_jobs],
        resources={
            "warehouse": WarehouseResource(database=str(work_dir / "warehouse.duckdb")),
            "pool": PoolResource(pool=POOL),
            "trainer": trainer,
            "conductor": conductor,
        },
    )


def run_stage(defs: dg.Definitions, stage: str, instance: dg.DagsterInstance, eval_config: dict) -> str:
    """Run one stage's job: 'ok', 'gated' (only a blocking check said no) or 'failed'."""
    if stage == "corpora":
        job, tags, run_config = corpora_job.name, None, {}
    elif stage == "probes":
        job, tags, run_config = probe_job.name, all_probe_partitions_tags(defs.get_assets_def(PROBE_CALLS).partitions_def), {}
    else:
        job, tags = f"smollm2_{stage}", None
        run_config = {"ops": {"eval_arms": {"config": eval_config}}} if stage == "eval" else {}
    result = defs.resolve_job_def(job).execute_in_process(
        instance=instance, tags=tags, raise_on_error=False,
        run_config={**run_config, "loggers": {"console": {"config": {"log_level": "INFO"}}}},
    )
    if result.success:
        return "ok"
    failures = [event.step_failure_data.error for event in result.all_events if event.is_step_failure]
    gated = [e for e in failures if is_blocking_check_failure(e) or ZERO_VARIANCE_GATE in e.message or "training refused" in e.message]
    return "gated" if failures and len(gated) == len(failures) else "failed"


# ---------------------------------------------------------------------------- the record


def experiment_report(instance: dg.DagsterInstance, store: Warehouse, sizes: dict, timings: dict[str, float], args) -> str:
    """The RESULTS markdown: every figure read back from the assets' metadata and the warehouse."""
    warm = _metadata(instance, "warm_start_policy")
    probe = _metadata(instance, "grpo_probe_run")
    grpo = _metadata(instance, "conductor_checkpoint")
    tables = _metadata(instance, "eval_tables")
    eval_run = _metadata(instance, "eval_arms").get("run_id")
    lines = [
        "# A real pretrained conductor on CPU: SmolLM2-135M-Instruct prompted, warm-started and GRPO-trained",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `benchmarks/smollm2_conductor.py{' --quick' if args.quick else ''}` "
        f"(pool {POOL}, trainer profile `cpu-smollm2`, LoRA rank {args.lora_rank}). Sizes: "
        + ", ".join(f"{k}={v}" for k, v in sizes.items()) + ".",
        "",
        "## Wall time per stage",
        "",
        "| stage | seconds |",
        "|---|---|",
        *[f"| {stage} | {seconds:.0f} |" for stage, seconds in timings.items()],
        f"| total | {sum(timings.values()):.0f} |",
        "",
        "## Parse rates (temperature 1)",
        "",
        "| policy | parse rate | samples | outcomes |",
        "|---|---|---|---|",
        f"| prompted (before the warm start) | {_fmt(warm.get('parse_rate_before'))} | {warm.get('parse_check', '-')} | "
        f"{json.dumps(warm.get('parse_codes_before'))} |",
        f"| warm-started | {_fmt(warm.get('parse_rate_after'))} | {warm.get('parse_check', '-')} | "
        f"{json.dumps(warm.get('parse_codes_after'))} |",
        "",
        f"Warm start: {warm.get('sft_steps', '-')} SFT steps on {warm.get('synthetic_pairs', '-')} synthetic pairs "
        f"({warm.get('synthetic_style', '-')} style), final loss {_fmt(warm.get('final_loss'))}.",
        "",
        "## The probe and its gate",
        "",
        str(probe.get("summary", "the probe did not run")),
        "",
        f"At the project's threshold (< {ZERO_VARIANCE_THRESHOLD:.2f}) the gate would have "
        + ("opened." if _below(probe.get("zero_variance_fraction"), ZERO_VARIANCE_THRESHOLD) else "stayed closed.")
        + f" This run trained if the share was below {args.gate_threshold:.2f}.",
        "",
        "### First half against second half of the probe's rollouts",
        "",
        str(probe.get("learning", "fewer than two steps")),
        "",
        "## GRPO training",
        "",
        f"Checkpoint: {grpo.get('checkpoint', 'none: training did not run (the gate stayed closed)')}",
        "",
        str(grpo.get("learning", "")),
        "",
        "## Evaluation",
        "",
        *_conductor_accuracies(store, eval_run),
        "",
        "### Every arm",
        "",
        str(tables.get("arm_table", "no eval tables")),
        "",
        "### Where each conductor's gap to the best single worker comes from",
        "",
        str(tables.get("decomposition", "no decomposition")),
        "",
    ]
    return "\n".join(lines)


def _conductor_accuracies(store: Warehouse, run_id: str | None) -> list[str]:
    """Each conductor arm: accuracy with its 95% Wilson interval, and the parse rate, from the run's rows."""
    if run_id is None:
        return ["no evaluation run"]
    frame = store.query_file("eval_workflows", {"run_id": run_id})
    rows = ["| conductor arm | n | accuracy | 95% interval | parse rate |", "|---|---|---|---|---|"]
    for arm in sorted(a for a in frame["arm"].unique().to_list() if a.startswith(ConductorArm.PREFIX)):
        scored = frame.filter((frame["arm"] == arm) & ~frame["infra_failure"])
        n, correct = scored.height, int(scored["correct"].fill_null(False).sum())
        low, high = wilson_interval(correct, n)
        parsed = float((scored["parse_code"] == "ok").mean()) if n else float("nan")
        rows.append(f"| {arm} | {n} | {correct / n if n else float('nan'):.3f} | [{float(low):.3f}, {float(high):.3f}] | {parsed:.3f} |")
    return rows


def _metadata(instance: dg.DagsterInstance, asset: str) -> dict:
    return {key: value.value for key, value in (latest_metadata(instance, asset) or {}).items()}


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _below(value, threshold: float) -> bool:
    return isinstance(value, int | float) and value < threshold


if __name__ == "__main__":
    sys.exit(main())
