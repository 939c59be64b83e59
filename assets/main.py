"""`make run`: materialize the whole asset graph on the embedded default pool, headless.

Runs the three main jobs in order in this project's Dagster instance ($DAGSTER_HOME), so every
run shows up in the UI afterwards, then prints the headline tables each asset published.
A failed blocking check (a gate) is reported, not hidden: downstream training then does not run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# Knobs a researcher changes most often, with their reason.
HEADLINES: list[tuple[str, list[str]]] = [
    # (asset, metadata entries to print): the questions a pool run must answer, in reading order
    ("questions", ["rows_total", "by_corpus_split_level"]),
    ("probe_calls", ["calls_written", "already_written", "status_counts"]),
    ("pass_rates", ["worker_accuracy"]),
    ("oracle_ceilings", ["ceilings"]),
    ("contested_set", ["counts", "one_sample_flips"]),
    ("grpo_probe_run", ["summary"]),
    ("conductor_checkpoint", ["checkpoint", "global_step"]),
    ("world_model_report", ["verdicts"]),
    ("eval_tables", ["arm_table", "decomposition"]),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pool", default=os.environ.get("CORYPHAEUS_POOL", "replay-mixed6"))
    parser.add_argument("--only", choices=["corpora_job", "probe_job", "analysis_job", "eval_job"], action="append")
    args = parser.parse_args(argv)
    # Partitions follow the pool file named here, so set it before the definitions load.
    os.environ["CORYPHAEUS_POOL"] = args.pool

    import dagster as dg

    from assets.definitions import MAIN_JOBS, defs
    from assets.probing import all_probe_partitions_tags

    instance = dg.DagsterInstance.get()
    all_partitions = all_probe_partitions_tags()
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
            tags=all_partitions if job.name == "probe_job" else None,
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


def print_headlines(instance) -> None:
    from assets.metadata import latest_metadata

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
