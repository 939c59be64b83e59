"""Evaluate a trained conductor checkpoint on any pool file, prompted as it was trained.

    .venv/bin/python -m assets.evaluate_checkpoint CHECKPOINT --pool POOL [--slice-size N] [--temperature T]
    .venv/bin/python -m assets.evaluate_checkpoint --trained [--seed N] --pool POOL

`--trained` evaluates the latest `make run`'s trained conductor and its warm start (of seed N,
when given) instead of a folder: its runs carry the training run's recipe and seed tags, so
`make seeds` pools its verdicts on POOL over the seeds like the default pool's. `make run` ends
with it on UNSEEN_POOL, six test models no part of the conductor's training saw, `--quick` (the
trained conductor beside the workers, routers and votes; `make seeds` adds its warm start and its
shuffled-catalogue twin).

The paper trains on randomised pools so that a conductor routes over worker sets it has not seen;
this asks whether one did. POOL is a name under data/pools/ or a path to any pool file: other
workers, the same workers in another order. The pool's corpora and probes are brought up to date as
`make run` would (only what is missing or stale runs: free on replay pools, paid on hosted ones;
a pool file with a blank description, a repeated name or a replay seat without recordings is
refused first, naming the file and the worker),
then `eval_job` runs with the checkpoint as its one conductor arm, in the pool file's order and
shuffled per question, beside every worker alone, the routers and the votes, and the headline tables
are printed. The checkpoint is prompted as its folder records it was trained
(`conductor_prompt.json`, written by the training assets); a folder without that record is prompted
like the `conductor` resource, with a warning. Runs land in $DAGSTER_HOME like `make run`'s.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import dagster as dg

from assets.definitions import definitions_for
from assets.deployment import QUICK_EVAL_TAG, RECIPE_TAG, SEED_TAG, TRAINED_RECIPE_TAG, run_tags
from assets.instance import open_instance
from assets.main import CONSOLE_INFO, MainRunReport, print_headlines, run_main_jobs
from assets.metadata import newest_tagged
from assets.results import UNSEEN_POOL
from conductor_pipeline.conductor.prompt import TRAINED_PROMPT_FILE, read_trained_prompt
from conductor_pipeline.pools.backends.replay import unrecorded_seats
from conductor_pipeline.pools.config import PoolConfig, PoolConfigError, load_pool, pool_path
from conductor_pipeline.reproducibility import DEFAULT_TORCH_THREADS, make_reproducible

# The jobs that bring a pool's questions and probes up to date before its evaluation.
SETUP_JOBS = ("corpora_job", "probe_job")
EVAL_JOB = "eval_job"
# The headlines of this command: the eval tables only.
EVAL_HEADLINES = ("eval_tables",)
CHECKPOINT_ASSET = "conductor_checkpoint"


def checked_pool(name_or_path: str) -> PoolConfig:
    """The pool file, refused (PoolConfigError, naming the file and the workers) when it cannot be
    evaluated: invalid, or with replay seats whose model has no recordings."""
    pool = load_pool(name_or_path)
    missing = unrecorded_seats(pool.workers)
    if missing:
        seats = ", ".join(f"{name} (model {model!r})" for name, model in missing.items())
        raise PoolConfigError(f"{pool_path(name_or_path)}: no recordings for replay workers {seats}")
    return pool


class NoTrainedConductor(LookupError):
    """No conductor was trained (of the seed asked for): none ran, or its gate closed."""


def trained_run_tags(instance: dg.DagsterInstance, seed: int | None = None) -> dict[str, str]:
    """The recipe, trained recipe and seed tags of the run behind the latest trained conductor (of
    `seed`, when given): the eval of that conductor on another pool carries them too, so it reads
    the same training."""
    found = newest_tagged(instance, CHECKPOINT_ASSET, {} if seed is None else {SEED_TAG: str(seed)})
    if found is not None:
        return {key: found[0][key] for key in (RECIPE_TAG, TRAINED_RECIPE_TAG, SEED_TAG) if key in found[0]}
    which = "" if seed is None else f" of seed {seed}"
    raise NoTrainedConductor(f"no trained conductor{which} in $DAGSTER_HOME (none was trained, or the zero-variance "
                             "gate closed)")


def eval_arms_config(checkpoint: Path | None, slice_size: int | None = None, quick: bool = False) -> dict[str, object]:
    """`eval_arms`' config: the checkpoint as the only conductor arm; with None, the latest trained
    conductor and its warm start (the default run's arms, so the warm start is paired too).
    `quick`: the conductor alone, in the pool file's order (no warm start, no shuffled twin)."""
    trained = checkpoint is None
    config: dict[str, object] = {
        "conductor_checkpoints": [] if trained else [str(checkpoint)],
        "use_trained_checkpoint": trained,
        "use_warm_start_policy": trained and not quick,
        "use_conductor_resource": False,
        **({"shuffled_catalogue": False} if quick else {}),
    }
    if slice_size is not None:
        config["slice_size"] = slice_size
    return config


def evaluate_checkpoint(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    checkpoint: Path | None,
    *,
    tags: dict[str, str],
    slice_size: int | None = None,
    quick: bool = False,
    op_config: Mapping[str, Mapping] | None = None,
    out: Callable[[str], object] = print,
) -> MainRunReport:
    """The setup jobs on what is missing or stale, then `eval_job` with the checkpoint as its one
    conductor arm (None: the latest trained conductor and its warm start); `op_config` adds config
    of other ops (e.g. a smaller probe in tests)."""
    extra = dict(op_config or {})

    def run_config(job: dg.JobDefinition, assets: Sequence[str]) -> dict:
        ops = {op: {"config": config} for op, config in extra.items() if op in assets and op != "eval_arms"}
        if "eval_arms" in assets:
            ops["eval_arms"] = {"config": {**extra.get("eval_arms", {}), **eval_arms_config(checkpoint, slice_size, quick)}}
        return {**CONSOLE_INFO, "ops": ops}

    report = run_main_jobs(defs, instance, jobs=list(SETUP_JOBS), tags=tags, run_config=run_config, out=out)
    if report.failed:
        return report
    evaluation = run_main_jobs(defs, instance, jobs=[EVAL_JOB], force=True, tags=tags, run_config=run_config, out=out)
    return MainRunReport(
        plans=[*report.plans, *evaluation.plans], failed=evaluation.failed, gated=[*report.gated, *evaluation.gated]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, nargs="?", help="a checkpoint folder (e.g. .../grpo/<run>/checkpoint-24)")
    parser.add_argument("--trained", action="store_true", help="the latest trained conductor and its warm start")
    parser.add_argument("--seed", type=int, default=None, help="with --trained: the conductor trained with this seed")
    parser.add_argument("--pool", default=UNSEEN_POOL,
                        help=f"pool name under data/pools/ or a path to a pool file (default {UNSEEN_POOL}: test models)")
    parser.add_argument("--slice-size", type=int, default=None, help="eval questions (default: eval_arms' default)")
    parser.add_argument("--quick", action="store_true",
                        help="the conductor alone, in the pool file's order: no warm start, no shuffled twin (`make run`)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sample the conductor at this temperature instead of its trained one (0: greedy)")
    parser.add_argument("--torch-threads", type=int, default=DEFAULT_TORCH_THREADS)
    args = parser.parse_args(argv)
    if args.trained == (args.checkpoint is not None):
        parser.error("give a checkpoint folder or --trained, not both")
    try:
        checked_pool(args.pool)
    except PoolConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    checkpoint = None if args.trained else args.checkpoint.resolve()
    if checkpoint is not None:
        if not (checkpoint / "config.json").is_file():
            parser.error(f"{checkpoint} is not a model folder (no config.json)")
        prompt = read_trained_prompt(checkpoint)
        if prompt is None:
            print(f"warning: no {TRAINED_PROMPT_FILE} in {checkpoint} or its parent: prompted like the conductor resource")
        else:
            print(f"prompted as trained: {prompt}")
    make_reproducible(torch_threads=args.torch_threads)
    instance = open_instance()
    tags = run_tags(args.pool) | ({QUICK_EVAL_TAG: "true"} if args.quick else {})
    if checkpoint is None:
        try:
            tags.update(trained_run_tags(instance, args.seed))
        except NoTrainedConductor as exc:  # a closed gate is an outcome of the run, not a failure
            print(f"\n{exc}: nothing to evaluate on {args.pool}")
            return 0
        print(f"\n######## the trained conductor ({', '.join(f'{k} {v}' for k, v in tags.items() if k in (RECIPE_TAG, SEED_TAG))}) "
              f"on {args.pool}, workers it never saw")
    if args.temperature is not None:
        print(f"sampled at temperature {args.temperature} instead of the trained one")
    report = evaluate_checkpoint(
        definitions_for(args.pool), instance, checkpoint, tags=tags, slice_size=args.slice_size, quick=args.quick,
        op_config={"eval_arms": {"checkpoint_temperature": args.temperature}} if args.temperature is not None else None,
    )
    # A failed step or a closed gate leaves no eval tables of this run: those in the instance are another run's.
    if report.failed:
        print(f"\nFAILED steps: {', '.join(report.failed)}")
        return 1
    if report.gated:
        print(f"\nBlocking checks stopped the eval ({', '.join(report.gated)}): no eval tables for this checkpoint")
        return 0
    print_headlines(instance, args.pool, assets=EVAL_HEADLINES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
