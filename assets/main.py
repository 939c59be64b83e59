"""`make run`: materialize the whole asset graph on one worker pool, headless.

Runs the four main jobs in order in this project's Dagster instance ($DAGSTER_HOME), so every
run shows up in the UI afterwards, then prints the headline tables each asset published.
A failed blocking check (a gate) is reported, not hidden: downstream training then does not run.
`--pool` picks the pool (default $CORYPHAEUS_POOL, else the embedded replay pool).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import dagster as dg

from assets.definitions import MAIN_JOBS, definitions_for
from assets.deployment import run_tags
from assets.metadata import latest_metadata
from assets.probing import PROBE_CALLS, all_probe_partitions_tags
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
     ["conductor_vs_best_single", "verdicts", "arm_table", "cost_story", "routing_value", "decomposition"]),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pool", default=default_pool_name(), help="Pool name under data/pools/ or a pool file")
    parser.add_argument("--only", choices=[job.name for job in MAIN_JOBS], action="append")
    args = parser.parse_args(argv)

    defs = definitions_for(args.pool)
    instance = dg.DagsterInstance.get()
    all_partitions = all_probe_partitions_tags(defs.get_assets_def(PROBE_CALLS).partitions_def)
    tags = run_tags(args.pool)  # pool, commit, profile: two runs of `make run` stay apart in the UI
    failed: list[str] = []
    gated: list[str] = []
    for job in MAIN_JOBS:
        if args.only and job.name not in args.only:
            continue
        started = time.monotonic()
        print(f"== {job.name} ...", flush=True)
        result = defs.resolve_job_def(job.name).execute_in_process(
            instance=instance,
            # INFO, not DEBUG: progress lines and failures, without every engine event
            run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}}},
            tags={**tags, **(all_partitions if job.name == "probe_job" else {})},
            raise_on_error=False,
        )
        checks = [
            f"{e.check_name}={'passed' if e.passed else 'FAILED'}" for e in result.get_asset_check_evaluations()
        ]
        status = "ok" if result.success else "FAILED"
        print(f"== {job.name}: {status} in {time.monotonic() - started:.0f}s (run {result.run_id}) {' '.join(checks)}")
        for event in result.all_events:
            if not event.is_step_failure:
                continue
            error = event.step_failure_data.error
            if is_blocking_check_failure(error):
                # A gate that says "no" is a result of the run, not a fault of it.
                gated.append(event.step_key)
                print(f"   gate closed at {event.step_key}: downstream assets were not materialized")
            else:
                failed.append(event.step_key)
                print(f"   step {event.step_key} failed: {error.message.strip()}")
    print_headlines(instance)
    if gated:
        print(f"\nBlocking checks stopped part of the graph: {', '.join(gated)} (see the check results above)")
    if failed:
        print(f"\nFAILED steps: {', '.join(failed)}")
    print(f"\nRuns are in {os.environ.get('DAGSTER_HOME')}; `make ui` opens them at http://127.0.0.1:3000")
    return 1 if failed else 0


def is_blocking_check_failure(error) -> bool:
    """Whether a step failed only because a blocking asset check it ran did not pass."""
    while error is not None:
        if error.cls_name == "DagsterAssetCheckFailedError":
            return True
        error = error.cause
    return False


def print_headlines(instance: dg.DagsterInstance) -> None:
    for asset, entries in HEADLINES:
        metadata = latest_metadata(instance, asset)
        if metadata is None:
            continue
        shown = [(name, metadata[name].value) for name in entries if name in metadata]
        if not shown:
            continue
        print(f"\n### {asset}")
        for name, value in shown:
            text = value if isinstance(value, str) else repr(value)
            print(f"{name}:\n{text}" if "\n" in text else f"{name}: {text}")


if __name__ == "__main__":
    sys.exit(main())
