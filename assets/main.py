"""`make run`: materialize what is missing or stale in the asset graph on one worker pool, headless.

Runs the four main jobs in order in this project's Dagster instance ($DAGSTER_HOME), so every
run shows up in the UI afterwards, then prints the headline tables each asset published.
Before each job it asks Dagster which of the job's assets are missing or stale (the status the
UI shows: a new code version, or an input with a new data version; assets/versions.py says what
a code version covers) and runs only those and what depends on them within the job; the rest
are skipped, with the reason. A second run with nothing changed recomputes nothing.
A failed blocking check (a gate) is reported, not hidden: downstream training then does not run,
in this run or in later ones, until what the check judged changes.
`--pool` picks the pool (default $CORYPHAEUS_POOL, else the embedded replay pool); `--force`
recomputes every asset of the selected jobs; `--config FILE` sets resources and asset config
(`assets/run_settings.py`). The process is made reproducible first (seeded global RNGs, a fixed
torch thread count, `--torch-threads`), so two fresh runs print the same figures.

A run survives being killed anywhere: the next one resumes. Before it plans anything it takes the
artifacts root's run lock (a second `make run` on the same artifacts waits for the first, saying
who holds it), marks the instance's runs whose process is gone as failed and frees their
concurrency slots (`assets/dead_runs.py`). SIGTERM and Ctrl-C stop the run cleanly: the running
step fails as interrupted, its slots are freed, and no later job starts.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from assets.dagster_internals import (
    CachingStaleStatusResolver,
    StaleCause,
    StaleStatus,
    check_execution_failed,
    check_execution_finished,
    stale_status_resolver,
)
from assets.dead_runs import SlotWaitMonitor, process_tags, reap_dead_runs, sigterm_as_ctrl_c
from assets.definitions import MAIN_JOBS, definitions_for
from assets.deployment import RECIPE_TAG, SEED_TAG, TRAINED_RECIPE_TAG, run_tags
from assets.instance import open_instance
from assets.metadata import newest_tagged
from assets.probing import PROBE_CALLS, all_probe_partitions_tags
from assets.results import DEFAULT_RECIPE, RECORD_PATH, against_the_record, eval_tables_event, record_from_event
from assets.run_settings import RunSettings, RunSettingsError, load_run_settings
from conductor_pipeline.locks import held_lock
from conductor_pipeline.reproducibility import DEFAULT_TORCH_THREADS, make_reproducible
from resources.pool import default_pool_name

# The headlines a pool run must answer, in reading order: (asset, metadata entries to print).
# Each entry is a key the asset's materialization emits (tests/assets/test_main.py checks them).
HEADLINES: list[tuple[str, list[str]]] = [
    ("questions", ["total_rows", "by_corpus_split_level"]),
    ("probe_calls", ["calls_written", "already_written", "status_counts"]),
    ("pass_rates", ["worker_accuracy"]),
    ("oracle_ceilings", ["ceilings"]),
    ("pool_search", ["verdict", "search_table"]),
    ("contested_set", ["counts_per_class", "one_sample_flips"]),
    ("grpo_probe_run", ["summary"]),
    ("conductor_checkpoint", ["checkpoint", "global_step"]),
    ("world_model_report", ["verdict"]),
    ("eval_tables",
     ["conductor_vs_best_single", "verdicts", "conductor_pairs", "order_invariance", "steps_by_position", "arm_table",
      "cost_story", "routing_value", "decomposition"]),
]
# The headline assets that hold the same rows whatever the pool.
POOL_FREE_HEADLINES = frozenset({"questions"})
# INFO, not DEBUG: progress lines and failures, without every engine event.
CONSOLE_INFO = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
# One headless run at a time per artifacts root: two would train into the same checkpoint folder.
RUN_LOCK_NAME = ".assets-main.lock"
# Exit status of a run stopped by SIGINT/SIGTERM (the shell's 128 + SIGINT).
INTERRUPTED_EXIT = 130


@dataclass
class JobPlan:
    """What one job will do: the assets it runs and why, and those it skips and why."""

    job: str
    run: dict[str, str] = field(default_factory=dict)
    fresh: list[str] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)


@dataclass
class MainRunReport:
    """What a main run did: per job its plan, and the steps that failed or were gated."""

    plans: list[JobPlan] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    gated: list[str] = field(default_factory=list)
    interrupted: str | None = None  # the signal that stopped the run, by name

    @property
    def materialized(self) -> list[str]:
        return [asset for plan in self.plans for asset in plan.run]


def describe_causes(causes: Sequence[StaleCause]) -> str:
    """`has a new code version`, `has a new dependency data version (probe_calls[gpt-4o])`, ..."""
    texts = []
    for cause in causes:
        dependency = cause.dependency
        where = ""
        if dependency is not None:
            partition = f"[{dependency.partition_key}]" if dependency.partition_key else ""
            where = f" ({dependency.asset_key.to_user_string()}{partition})"
        texts.append(f"{cause.reason}{where}")
    return "; ".join(dict.fromkeys(texts))


def _own_status(resolver: CachingStaleStatusResolver, assets_def: dg.AssetsDefinition, key: dg.AssetKey) -> str | None:
    """Why the asset must run by its own status (missing, or stale and the causes), or None when fresh."""
    partitions = assets_def.partitions_def
    keys = partitions.get_partition_keys() if partitions is not None else [None]
    missing = [p for p in keys if resolver.get_status(key, p) == StaleStatus.MISSING]
    if missing:
        return "never materialized" if missing == keys else f"partitions never materialized: {', '.join(missing)}"
    stale = [p for p in keys if resolver.get_status(key, p) == StaleStatus.STALE]
    if not stale:
        return None
    causes = [cause for p in stale for cause in resolver.get_stale_causes(key, p)]
    return f"stale: {describe_causes(causes)}"


def failed_blocking_check(
    defs: dg.Definitions, instance: dg.DagsterInstance, key: dg.AssetKey
) -> str | None:
    """The blocking check on `key` that failed on its latest materialization, if one did."""
    asset_graph = defs.resolve_asset_graph()
    blocking = [k for k in asset_graph.get_check_keys_for_assets({key}) if asset_graph.get_check_spec(k).blocking]
    if not blocking:
        return None
    latest = instance.get_latest_materialization_event(key)
    if latest is None:
        return None
    executions = instance.event_log_storage.get_latest_asset_check_execution_by_key(blocking)
    for check_key, execution in sorted(executions.items(), key=lambda item: item[0].name):
        if check_execution_failed(execution) and execution.run_id == latest.run_id:
            return check_key.name
    return None


def unfinished_blocking_check(
    defs: dg.Definitions, instance: dg.DagsterInstance, key: dg.AssetKey
) -> str | None:
    """A blocking check of `key` that never finished on its latest materialization (the run was
    killed between the asset's step and the check's). Its verdict is what downstream steps wait on,
    so the asset runs again, and the check with it."""
    asset_graph = defs.resolve_asset_graph()
    blocking = [k for k in asset_graph.get_check_keys_for_assets({key}) if asset_graph.get_check_spec(k).blocking]
    latest = instance.get_latest_materialization_event(key) if blocking else None
    if latest is None:
        return None
    executions = instance.event_log_storage.get_latest_asset_check_execution_by_key(blocking)
    for check_key in sorted(blocking, key=lambda k: k.name):
        execution = executions.get(check_key)
        finished = execution is not None and check_execution_finished(execution)
        if not finished or execution.run_id != latest.run_id:
            return check_key.name
    return None


def plan_job(
    defs: dg.Definitions, instance: dg.DagsterInstance, job_name: str, *, force: bool = False
) -> JobPlan:
    """Which of the job's assets run: those missing or stale, those whose blocking check never
    finished, and within the job everything downstream of them (their inputs get new data versions
    when they run). An asset whose input in the job failed a blocking check on its latest
    materialization is held, as the run would hold it."""
    asset_graph = defs.resolve_asset_graph()
    job = next(job for job in MAIN_JOBS if job.name == job_name)
    selected = job.selection.resolve(asset_graph)
    resolver = stale_status_resolver(defs, instance)
    plan = JobPlan(job_name)
    for key in (k for k in asset_graph.toposorted_asset_keys if k in selected):
        name = key.to_user_string()
        parents = [parent for parent in asset_graph.get(key).parent_keys if parent in selected]
        upstream = [p.to_user_string() for p in parents if p.to_user_string() in plan.run]
        unfinished = None if force else unfinished_blocking_check(defs, instance, key)
        reason = (
            "--force" if force
            else _own_status(resolver, defs.get_assets_def(key), key)
            or (f"its blocking check {unfinished} never finished on its latest materialization" if unfinished else None)
            or (f"upstream {', '.join(upstream)} is recomputed" if upstream else None)
        )
        if reason is None:
            plan.fresh.append(name)
            continue
        waiting = [p.to_user_string() for p in parents if p.to_user_string() in plan.held]
        gate = None if force else next(
            ((p, check) for p in parents if p.to_user_string() not in plan.run
             for check in [failed_blocking_check(defs, instance, p)] if check),
            None,
        )
        if waiting:
            plan.held[name] = f"waits for {', '.join(waiting)}"
        elif gate is not None:
            plan.held[name] = f"blocking check {gate[1]} on {gate[0].to_user_string()} failed"
        else:
            plan.run[name] = reason
    return plan


def warehouse_is_missing(defs: dg.Definitions) -> Path | None:
    """The warehouse file when the definitions' warehouse does not exist: the instance may remember
    fresh assets whose rows are gone (a deleted artifacts folder), so everything is recomputed."""
    warehouse = defs.resources.get("warehouse")
    path = Path(str(getattr(warehouse, "database", "")))
    return path if warehouse is not None and not path.exists() else None


def run_main_jobs(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    *,
    jobs: Sequence[str] | None = None,
    force: bool = False,
    run_config: Callable[[dg.JobDefinition, Sequence[str]], Mapping] | None = None,
    tags: Mapping[str, str] | None = None,
    out: Callable[[str], object] = print,
) -> MainRunReport:
    """Run the main jobs (or `jobs`) in order, each on what it has missing or stale (everything with
    `force`). `run_config(job, assets)` gives a run's config (default: console logging at INFO)."""
    report = MainRunReport()
    all_partitions = all_probe_partitions_tags(defs.get_assets_def(PROBE_CALLS).partitions_def)
    for job in MAIN_JOBS:
        if jobs and job.name not in jobs:
            continue
        plan = plan_job(defs, instance, job.name, force=force)
        report.plans.append(plan)
        for name, why in plan.held.items():
            out(f"   held {name}: {why}")
        if not plan.run:
            out(f"== {job.name}: nothing to do ({len(plan.fresh)} fresh: {', '.join(plan.fresh)})")
            continue
        started = time.monotonic()
        skipped = f"; {len(plan.fresh)} fresh, skipped: {', '.join(plan.fresh)}" if plan.fresh else ""
        out(f"== {job.name}: {len(plan.run)} to materialize{skipped}")
        for name, why in plan.run.items():
            out(f"   {name}: {why}")
        job_def = defs.resolve_job_def(job.name)
        run_id = str(uuid.uuid4())
        with SlotWaitMonitor(instance, run_id, out).watching() as monitor:
            result = job_def.execute_in_process(
                instance=instance,
                run_config=run_config(job_def, list(plan.run)) if run_config else CONSOLE_INFO,
                asset_selection=[dg.AssetKey.from_user_string(name) for name in plan.run],
                run_id=run_id,
                tags={**(tags or {}), **process_tags(), **(all_partitions if PROBE_CALLS in plan.run else {})},
                raise_on_error=False,
            )
        checks = [
            f"{e.check_name}={'passed' if e.passed else 'FAILED'}" for e in result.get_asset_check_evaluations()
        ]
        status = "ok" if result.success else "FAILED"
        out(f"== {job.name}: {status} in {time.monotonic() - started:.0f}s (run {result.run_id}) {' '.join(checks)}")
        for event in result.all_events:
            if not event.is_step_failure:
                continue
            error = event.step_failure_data.error
            if is_blocking_check_failure(error):
                # A gate that says "no" is a result of the run, not a fault of it.
                report.gated.append(event.step_key)
                out(f"   gate closed at {event.step_key}: downstream assets were not materialized")
            else:
                report.failed.append(event.step_key)
                out(f"   step {event.step_key} failed: {raised_by_the_step(error).message.strip()}")
        if monitor.signal is not None:
            report.interrupted = signal.Signals(monitor.signal).name
            out(f"== interrupted by {report.interrupted}: run {result.run_id} stopped, its slots freed; later jobs "
                "were not started (rerun to resume)")
            return report
    return report


def settings_run_config(settings: RunSettings) -> Callable[[dg.JobDefinition, Sequence[str]], Mapping]:
    """A run's config: console logging at INFO plus the settings file's config of the assets it runs."""
    return lambda job, assets: {**CONSOLE_INFO, **settings.run_config(list(assets))}


def check_settings_ops(defs: dg.Definitions, settings: RunSettings) -> None:
    """Refuse, before any step runs, op config that no main job would apply or that its asset's config
    schema rejects: a misspelt op name would otherwise be dropped silently, after minutes of work."""
    asset_graph = defs.resolve_asset_graph()
    for name, config in settings.ops.items():
        key = dg.AssetKey.from_user_string(name)
        job = next((job for job in MAIN_JOBS if key in job.selection.resolve(asset_graph)), None)
        if job is None:
            raise RunSettingsError(f"{settings.source}: ops.{name} is not an asset `make run` materializes")
        try:
            dg.validate_run_config(defs.resolve_job_def(job.name), {"ops": {name: {"config": dict(config)}}})
        except dg.DagsterInvalidConfigError as exc:
            problems = "; ".join(error.message for error in exc.errors)
            raise RunSettingsError(f"{settings.source}: ops.{name}: {problems}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool", default=default_pool_name(), help="Pool name under data/pools/ or a pool file")
    parser.add_argument("--only", choices=[job.name for job in MAIN_JOBS], action="append")
    parser.add_argument("--force", action="store_true", help="Recompute every asset, stale or not")
    parser.add_argument("--torch-threads", type=int, default=DEFAULT_TORCH_THREADS,
                        help="torch's intra-op threads; the same count on two runs gives the same figures")
    parser.add_argument("--config", help="YAML of resource settings and asset config (assets/run_settings.py)")
    parser.add_argument("--seed", type=int, default=None,
                        help="The trainer's seed (warm start, GRPO, pool draws); each seed keeps its own checkpoints "
                        "and its runs are tagged `seed` (default: the settings file's, else 0)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, sigterm_as_ctrl_c)
    make_reproducible(torch_threads=args.torch_threads)
    try:
        settings = load_run_settings(args.config) if args.config else RunSettings()
        if args.seed is not None:
            settings = settings.with_resource("trainer", seed=args.seed)
        defs = definitions_for(args.pool, settings)
        check_settings_ops(defs, settings)
    except RunSettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lock = Path(str(defs.resources["warehouse"].artifacts_root)) / RUN_LOCK_NAME
    try:
        with held_lock(lock, f"the artifacts folder {lock.parent} (a run holds it)", log=print):
            report = _run_locked(defs, open_instance(), args, settings)
    except KeyboardInterrupt as exc:
        print(f"\ninterrupted ({exc or 'SIGINT'}): nothing more runs; rerun to resume")
        return INTERRUPTED_EXIT
    if report.interrupted:
        return INTERRUPTED_EXIT
    return 1 if report.failed else 0


def _run_locked(defs: dg.Definitions, instance: dg.DagsterInstance, args: argparse.Namespace, settings: RunSettings) -> MainRunReport:
    """What `main` does holding the run lock: free what dead runs hold, plan and run the jobs, report."""
    reap_dead_runs(instance, print)
    force = args.force
    missing = warehouse_is_missing(defs)
    if missing is not None and not force:
        print(f"no warehouse at {missing}: recomputing everything")
        force = True
    # pool, commit, profile, recipe and seed: two runs of `make run` stay apart in the UI
    trainer = defs.resources["trainer"]
    tags = {
        **run_tags(args.pool), RECIPE_TAG: settings.recipe(trainer.profile), SEED_TAG: str(trainer.seed),
        TRAINED_RECIPE_TAG: settings.trained_recipe(trainer.profile),
    }
    report = run_main_jobs(defs, instance, jobs=args.only, force=force, tags=tags,
                           run_config=settings_run_config(settings))
    if report.interrupted:
        return report
    print_headlines(instance, args.pool)
    if args.pool == default_pool_name() and tags[RECIPE_TAG] == DEFAULT_RECIPE:
        print_against_the_record(instance, args.pool, tags)
    fresh = [name for plan in report.plans for name in plan.fresh]
    held = {name: why for plan in report.plans for name, why in plan.held.items()}
    if fresh:
        print(f"\nSkipped {len(fresh)} fresh assets (code, settings and inputs unchanged since their latest "
              f"materialization; `make run-all` or --force recomputes them): {', '.join(fresh)}")
    if held:
        print(f"\nHeld: {'; '.join(f'{name} ({why})' for name, why in held.items())}")
    if report.gated:
        print(f"\nBlocking checks stopped part of the graph: {', '.join(report.gated)} (see the check results above)")
    if report.failed:
        print(f"\nFAILED steps: {', '.join(report.failed)}")
    print(f"\nRuns are in {os.environ.get('DAGSTER_HOME')}; `make ui` opens them at http://127.0.0.1:3000")
    return report


def print_against_the_record(instance: dg.DagsterInstance, pool: str, tags: Mapping[str, str]) -> None:
    """The trained conductor's accuracy of this seed's eval against the recorded seeds' spread."""
    if not RECORD_PATH.is_file():
        return
    try:
        event = eval_tables_event(instance, pool, {key: tags[key] for key in (RECIPE_TAG, SEED_TAG)})
    except SystemExit:  # no eval of this recipe and seed (a gate closed): nothing to compare
        return
    lines = against_the_record(json.loads(RECORD_PATH.read_text()), record_from_event(instance, event)["arms"])
    if lines:
        print("\n### against the record\n" + "\n".join(lines))


def raised_by_the_step(error):
    """The error the op itself raised, under Dagster's wrapping (`DagsterExecutionStepExecutionError`):
    the one whose message names the file, the worker or the field."""
    while error.cls_name.startswith("Dagster") and error.cause is not None:
        error = error.cause
    return error


def is_blocking_check_failure(error) -> bool:
    """Whether a step failed only because a blocking asset check it ran did not pass."""
    while error is not None:
        if error.cls_name == "DagsterAssetCheckFailedError":
            return True
        error = error.cause
    return False


def print_headlines(instance: dg.DagsterInstance, pool: str, assets: Sequence[str] | None = None) -> None:
    """The headline entries of each asset's latest materialization for `pool` (of `assets` only, when
    given). The asset keys are the same for every pool, so an instance that ran other pools holds
    their materializations too; a run without a pool tag (the UI's ad-hoc materializations) counts
    as this pool's. The corpora are every pool's."""
    def other_pool(tags: Mapping[str, str]) -> bool:
        return tags.get("pool", pool) != pool

    for asset, entries in HEADLINES:
        if assets is not None and asset not in assets:
            continue
        found = newest_tagged(instance, asset, {}, skip=None if asset in POOL_FREE_HEADLINES else other_pool)
        metadata = {} if found is None else found[1].asset_materialization.metadata
        shown = [(name, metadata[name].value) for name in entries if name in metadata]
        if shown:
            print(f"\n### {asset}")
        for name, value in shown:
            text = value if isinstance(value, str) else repr(value)
            print(f"{name}:\n{text}" if "\n" in text else f"{name}: {text}")


def cli() -> None:
    """`make run` and `coryphaeus-run`: `main` in a process of its own, out of the garbage
    collector's way. The modules imported before it live as long as the process, so full
    collections need not walk them; and the interpreter's last full collection, which walks every
    object the run left (the libraries, the models) for seconds on two cores to free memory the
    exiting process gives back anyway, is skipped. atexit handlers still run."""
    gc.freeze()
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    cli()
