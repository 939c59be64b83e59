"""Measure the CPU training chain: warm start -> parse rate at temperature 1 -> GRPO probe -> gate.

Why: the CPU profile's knobs (tiny model shape, SFT steps and lr, warm-start style, group size,
completion cap, contest-keeping sub-pools) were chosen by running this script, and anyone changing
them should rerun it and quote its lines. It runs the real training assets (`assets.training`)
on a COPY of a finished default run's warehouse (the contested set is recomputed from its cached
probes; nothing is written into the source), and prints one line per configuration:

    parse rate after SFT at T=1 (and its failure codes), final SFT loss, SFT seconds,
    probe zero-variance fraction (group size, groups), probe seconds per step, gate verdict,
    and, with --train-steps, the training run's seconds (as the last line of stdout, as JSON;
    TRL's own step logs come before it).

Example (the default CPU profile, then a variant):

    .venv/bin/python -m scripts.tune_cpu_conductor
    .venv/bin/python -m scripts.tune_cpu_conductor --hidden 64 --layers 2 --group-size 4
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

# A finished `make run` of the default pool in this checkout (override with --source).
DEFAULT_SOURCE = Path(__file__).resolve().parents[1] / "artifacts" / "warehouse.duckdb"
DEFAULT_WORKDIR = Path("/tmp/tune_cpu_conductor")


def _copy_source(source: Path, workdir: Path) -> Path:
    """The source warehouse (and its world model, if any) copied under workdir, once."""
    artifacts = workdir / "artifacts"
    database = artifacts / "warehouse.duckdb"
    if not database.is_file():
        artifacts.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, database)
        if (source.parent / "world_model").is_dir():
            shutil.copytree(source.parent / "world_model", artifacts / "world_model", dirs_exist_ok=True)
    return database


def main(argv: list[str] | None = None) -> int:
    from conductor_pipeline.training.settings import (
        CPU_POLICY_HIDDEN_SIZE,
        CPU_POLICY_LAYERS,
        GRPOSettings,
        SFTSettings,
    )

    cpu, sft = GRPOSettings.cpu_profile(), SFTSettings.cpu_profile()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="warehouse.duckdb of a finished run")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--pool", default="replay-mixed6")
    parser.add_argument("--hidden", type=int, default=CPU_POLICY_HIDDEN_SIZE)
    parser.add_argument("--layers", type=int, default=CPU_POLICY_LAYERS)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--sft-steps", type=int, default=sft.max_steps)
    parser.add_argument("--sft-lr", type=float, default=sft.learning_rate)
    parser.add_argument("--sft-examples", type=int, default=None)
    parser.add_argument("--style", choices=["paper", "compact"], default="compact")
    parser.add_argument("--group-size", type=int, default=cpu.num_generations)
    parser.add_argument("--questions-per-step", type=int, default=cpu.questions_per_step)
    parser.add_argument("--probe-steps", type=int, default=20)
    parser.add_argument("--train-steps", type=int, default=0, help="also train this many GRPO steps (0: stop at the gate)")
    parser.add_argument("--max-completion-length", type=int, default=cpu.max_completion_length)
    parser.add_argument("--grpo-lr", type=float, default=cpu.learning_rate)
    parser.add_argument("--no-contested-subpools", action="store_true")
    parser.add_argument("--prune", action="store_true", help="world-model pruning (needs <source dir>/world_model)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import dagster as dg

    from assets.training import (
        TRAINING_ASSETS,
        TRAINING_CHECKS,
        conductor_checkpoint,
        contested_set,
        grpo_probe_run,
        pass_rates,
        warm_start_policy,
    )
    from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
    from resources.pool import PoolResource
    from resources.trainer import DEFAULT_SFT_EXAMPLES, SFTOverrides, TrainerResource
    from resources.warehouse import WarehouseResource

    database = _copy_source(args.source, args.workdir)
    started = time.monotonic()
    model = build_tiny_causal_lm(
        args.workdir / "models" / f"tiny-h{args.hidden}-l{args.layers}-s{args.seed}",
        hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads, seed=args.seed,
    )
    build_s = time.monotonic() - started
    tag = (
        f"h{args.hidden}l{args.layers}-sft{args.sft_steps}x{args.sft_lr:g}-{args.style}-g{args.group_size}"
        f"q{args.questions_per_step}-mcl{args.max_completion_length}-lr{args.grpo_lr:g}"
        f"{'-free' if args.no_contested_subpools else ''}{'-prune' if args.prune else ''}-s{args.seed}"
    )
    trainer = TrainerResource(
        output_root=str(args.workdir / "training" / tag), policy_model=str(model), seed=args.seed,
        sft=SFTOverrides(max_steps=args.sft_steps, learning_rate=args.sft_lr), synthetic_style=args.style,
        sft_examples=args.sft_examples or DEFAULT_SFT_EXAMPLES,
        num_generations=args.group_size, questions_per_step=args.questions_per_step, probe_steps=args.probe_steps,
        max_steps=args.train_steps or None, max_completion_length=args.max_completion_length,
        learning_rate=args.grpo_lr, contested_subpools=not args.no_contested_subpools,
        prune_with_world_model=args.prune,
    )
    selected = [contested_set, warm_start_policy, grpo_probe_run] + ([conductor_checkpoint] if args.train_steps else [])
    result = dg.materialize(
        [*TRAINING_ASSETS, *TRAINING_CHECKS, pass_rates],
        selection=dg.AssetSelection.assets(*selected),
        resources={"warehouse": WarehouseResource(database=str(database)), "pool": PoolResource(pool=args.pool), "trainer": trainer},
        raise_on_error=False,
    )
    total_s = time.monotonic() - started
    meta = {name: result.asset_materializations_for_node(name) for name in ("warm_start_policy", "grpo_probe_run", "conductor_checkpoint")}

    def value(node: str, key: str):
        events = meta[node]
        return events[0].metadata[key].value if events and key in events[0].metadata else None

    gate = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    codes = value("warm_start_policy", "parse_codes_after") or {}
    line = {
        "config": tag,
        "parse_rate_after_sft_T1": value("warm_start_policy", "parse_rate_after"),
        "parse_codes_after": codes,
        "sft_final_loss": round(value("warm_start_policy", "final_loss") or float("nan"), 4),
        "sft_s": value("warm_start_policy", "sft_elapsed_s"),
        "warm_start_s": value("warm_start_policy", "elapsed_s"),
        "zero_variance_fraction": value("grpo_probe_run", "zero_variance_fraction"),
        "group_size": value("grpo_probe_run", "group_size"),
        "groups": value("grpo_probe_run", "groups"),
        "probe_s": value("grpo_probe_run", "elapsed_s"),
        "probe_s_per_step": value("grpo_probe_run", "seconds_per_step"),
        "probe_last_parse_fail": value("grpo_probe_run", "last_parse_fail_rate"),
        "gate": gate.get("zero_variance_gate"),
        "train_s": value("conductor_checkpoint", "elapsed_s"),
        "train_step": value("conductor_checkpoint", "step"),
        "pruning": value("grpo_probe_run", "world_model_pruning"),
        "model_build_s": round(build_s, 1),
        "total_s": round(total_s, 1),
    }
    print(json.dumps(line))
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
