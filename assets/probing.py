"""Probing assets: probe the pool k times per question, then pass rates and oracle ceilings.

`probe_calls` is partitioned by worker (the partitions follow the pool file named by
$CORYPHAEUS_POOL when the definitions load). With a single-run backfill policy one run probes
every selected worker concurrently through one governor; the library writes each call to the
warehouse as it completes and skips calls already written, so a rerun after a kill resumes.
`reprobe_schedule` adds new sample indices on the same questions; an eager automation condition
(evaluated by `probing_automation_sensor`) refreshes pass rates and ceilings after it.
"""


import asyncio
import math
import time
from collections.abc import Mapping, Sequence

import dagster as dg
import numpy as np
import polars as pl
from pydantic import Field
from tabulate import tabulate

from assets.metadata import png_markdown
from conductor_pipeline.plots import PASS_RATE_BINS, pass_rate_plot
from conductor_pipeline.pools.backends.base import Worker
from conductor_pipeline.pools.config import PoolConfig, load_pool
from conductor_pipeline.probing.ceilings import pool_ceilings
from conductor_pipeline.probing.pass_rates import pass_rate_table, worker_summary
from conductor_pipeline.probing.runner import ProbeProgress, ProbeSummary, run_probes, select_questions
from conductor_pipeline.warehouse import Warehouse
from resources.pool import PoolResource, default_pool_name
from resources.warehouse import WarehouseResource

GROUP = "probing"
# Log progress at most this often: a replay probe completes thousands of calls per second.
PROGRESS_LOG_INTERVAL_S = 5.0
STATUSES = ("ok", "truncated", "empty", "transient", "terminal", "not_recorded")

# Partitions follow the pool the definitions load with; a run checks its keys against the pool it uses.
PROBE_PARTITIONS = dg.StaticPartitionsDefinition(load_pool(default_pool_name()).worker_names)


class ProbeConfig(dg.Config):
    """What to probe: the question slice, samples per question and decoding temperature."""

    samples: int = Field(6, ge=1, description="Samples per question x worker (one sample is a coin flip)")
    temperature: float = Field(0.2, ge=0, description="Sampling temperature (the paper's worker temperature)")
    corpora: list[str] = Field(["math", "gsm8k"], description="Corpora of the slice")
    splits: list[str] = Field(["test"], description="Source splits of the slice")
    math_levels: list[int] = Field([5], description="MATH levels of the slice (GSM8K has none)")
    max_questions: int | None = Field(None, ge=1, description="Cap on the slice (a deterministic mixed sample)")
    only_recorded: bool = Field(
        True, description="Replay seats: probe only what their recordings cover (no not_recorded rows)"
    )
    sample_offset: int = Field(0, ge=0, description="First sample index (sample ids are part of each call's key)")
    new_samples: bool = Field(
        False, description="Start above the highest sample index already probed for this pool (re-probing)"
    )
    batch_size: int = Field(500, ge=1, description="Rows per warehouse write; a kill loses at most one batch")


def _status_table(per_worker: Mapping[str, Mapping[str, int]]) -> str:
    rows = [[w, *(counts.get(s, 0) for s in STATUSES), sum(counts.values())] for w, counts in per_worker.items()]
    return tabulate(rows, headers=["worker", *STATUSES, "total"], tablefmt="github")


def _probe(
    warehouse: Warehouse,
    pool: PoolConfig,
    workers: dict[str, Worker],
    config: ProbeConfig,
    sample_offset: int,
    run_id: str,
    log: dg.DagsterLogManager,
    governor_factory: PoolResource,
) -> ProbeSummary:
    questions = select_questions(
        warehouse,
        corpora=config.corpora,
        splits=config.splits,
        math_levels=config.math_levels,
        limit=config.max_questions,
    )
    if not questions:
        raise dg.Failure(f"the slice {config.corpora}/{config.splits}/levels {config.math_levels} has no questions; "
                         "materialize `questions` first")
    last_log = [0.0]

    def on_progress(report: ProbeProgress) -> None:
        now = time.monotonic()
        if now - last_log[0] >= PROGRESS_LOG_INTERVAL_S or report.done == report.total:
            last_log[0] = now
            log.info(f"probe {pool.name}: {report.describe()}")

    async def go() -> ProbeSummary:
        try:
            return await run_probes(
                warehouse,
                pool,
                workers,
                questions,
                samples=config.samples,
                sample_offset=sample_offset,
                temperature=config.temperature,
                run_id=run_id,
                governor=governor_factory.governor(),
                batch_size=config.batch_size,
                on_progress=on_progress,
                only_recorded=config.only_recorded,
            )
        finally:
            for worker in workers.values():
                await worker.aclose()

    log.info(f"probing {len(workers)} worker(s) of {pool.name} on {len(questions)} questions, "
             f"samples {sample_offset}..{sample_offset + config.samples - 1}")
    return asyncio.run(go())


@dg.asset(
    group_name=GROUP,
    partitions_def=PROBE_PARTITIONS,
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=["questions"],
    kinds={"duckdb"},
)
def probe_calls(
    context: dg.AssetExecutionContext, config: ProbeConfig, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """Every (question, worker, sample) probe call of the slice, graded and written as it completes."""
    pool_config = pool.load()
    selected = list(context.partition_keys)
    unknown = sorted(set(selected) - set(pool_config.worker_names))
    if unknown:
        raise dg.Failure(
            f"partitions {unknown} are not workers of pool {pool_config.name!r} ({pool_config.worker_names}); "
            f"the definitions were loaded with pool {default_pool_name()!r}: set CORYPHAEUS_POOL consistently"
        )
    store = warehouse.get_warehouse()
    sample_offset = config.sample_offset
    if config.new_samples:
        highest = store.query_file("max_probe_sample", {"pool": pool_config.name})["max_sample"][0]
        sample_offset = 0 if highest is None else int(highest) + 1
    workers = pool.build_workers(selected)
    summary = _probe(store, pool_config, workers, config, sample_offset, context.run_id, context.log, pool)
    context.log.info(
        f"probe {pool_config.name}: wrote {summary.written} calls in {summary.elapsed_s:.1f}s "
        f"({summary.rate_per_s:.0f}/s); {summary.already_done} were already written"
    )
    return dg.MaterializeResult(
        metadata={
            "pool": dg.MetadataValue.text(pool_config.name),
            "workers": dg.MetadataValue.json(selected),
            "calls_written": dg.MetadataValue.int(summary.written),
            "calls_planned": dg.MetadataValue.int(summary.planned),
            "already_written": dg.MetadataValue.int(summary.already_done),
            "skipped_unrecorded": dg.MetadataValue.int(summary.skipped_unrecorded),
            "samples": dg.MetadataValue.text(f"{sample_offset}..{sample_offset + config.samples - 1}"),
            "status_counts": dg.MetadataValue.md(_status_table(summary.per_worker_status)),
            "calls_per_second": dg.MetadataValue.float(round(summary.rate_per_s, 1)),
            "elapsed_s": dg.MetadataValue.float(round(summary.elapsed_s, 2)),
        }
    )


def _fmt(value: object, digits: int = 3) -> object:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return round(value, digits) if isinstance(value, float) else value


def accuracy_markdown(summary: pl.DataFrame) -> str:
    rows = [
        [
            r["worker"],
            r["scored"],
            _fmt(r["accuracy"]),
            f"[{_fmt(r['accuracy_low'])}, {_fmt(r['accuracy_high'])}]",
            _fmt(r["mean_prompt_tokens"], 0),
            _fmt(r["mean_completion_tokens"], 0),
            "est." if r["tokens_estimated"] else "reported",
            _fmt(r["total_cost_usd"], 4),
            _fmt(r["mean_latency_s"], 2),
        ]
        for r in summary.iter_rows(named=True)
    ]
    headers = ["worker", "scored calls", "accuracy", "95% CI (Wilson)", "mean prompt tokens",
               "mean completion tokens", "token counts (est. = estimated)", "total cost (USD)", "mean latency (s)"]
    return tabulate(rows, headers=headers, tablefmt="github")


def _percent(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def status_rate_markdown(summary: pl.DataFrame) -> str:
    """Per worker, the share of calls in each status (percent of that worker's calls, not counts)."""
    rows = [[r["worker"], r["calls"], *(_percent(r[f"{s}_rate"]) for s in STATUSES)] for r in summary.iter_rows(named=True)]
    return tabulate(rows, headers=["worker", "calls", *(f"{s} %" for s in STATUSES)], tablefmt="github")


def pass_rate_histogram(rates: pl.DataFrame, workers: Sequence[str]) -> str:
    """Markdown: per worker, how many questions fall in each pass-rate bin."""
    rows = []
    for worker in workers:
        values = rates.filter(pl.col("worker") == worker)["pass_rate"].to_numpy()
        counts, _ = np.histogram(values, bins=PASS_RATE_BINS)
        rows.append([worker, *counts.tolist()])
    headers = ["worker", *(f"{lo:.2f}-{hi:.2f}" for lo, hi in zip(PASS_RATE_BINS[:-1], PASS_RATE_BINS[1:]))]
    return tabulate(rows, headers=headers, tablefmt="github")


@dg.asset(
    group_name=GROUP,
    deps=[probe_calls],
    kinds={"duckdb", "parquet"},
    automation_condition=dg.AutomationCondition.eager(),
)
def pass_rates(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """Per question x worker pass rates with 95% intervals; per worker accuracy, status rates, tokens, cost."""
    pool_config = pool.load()
    store = warehouse.get_warehouse()
    rates = pass_rate_table(store, pool_config.name).filter(pl.col("worker").is_in(pool_config.worker_names))
    summary = worker_summary(store, pool_config.name).filter(pl.col("worker").is_in(pool_config.worker_names))
    if rates.is_empty():
        raise dg.Failure(f"no scored probe calls for pool {pool_config.name!r}: materialize probe_calls first")
    workers = [w for w in pool_config.worker_names if w in set(summary["worker"].to_list())]
    out_dir = warehouse.artifact_dir("pass_rates")
    table_path = out_dir / f"{pool_config.name}.parquet"
    rates.write_parquet(table_path)
    png = pass_rate_plot(rates, workers, f"{pool_config.name}: pass-rate distribution per worker")
    plot_path = out_dir / f"{pool_config.name}.png"
    plot_path.write_bytes(png)
    samples = rates["samples"]
    context.log.info(f"pass rates of {rates.height} question x worker pairs written to {table_path}")
    return dg.MaterializeResult(
        metadata={
            "pool": dg.MetadataValue.text(pool_config.name),
            "question_worker_pairs": dg.MetadataValue.int(rates.height),
            "questions": dg.MetadataValue.int(rates["question_id"].n_unique()),
            "samples_per_pair": dg.MetadataValue.text(f"min {samples.min()}, median {samples.median()}, max {samples.max()}"),
            "worker_accuracy": dg.MetadataValue.md(accuracy_markdown(summary)),
            "status_rates": dg.MetadataValue.md(status_rate_markdown(summary)),
            "pass_rate_histogram": dg.MetadataValue.md(pass_rate_histogram(rates, workers)),
            "pass_rate_plot": png_markdown(png, "pass-rate distribution per worker"),
            "pass_rate_plot_path": dg.MetadataValue.path(str(plot_path)),
            "table_path": dg.MetadataValue.path(str(table_path)),
        }
    )


def ceilings_markdown(table: pl.DataFrame) -> str:
    rows = [
        [r["row"], r["size"], r["n_questions"], r["best_worker"], _fmt(r["best_single"]), _fmt(r["oracle"]),
         _fmt(r["headroom"]), r["unsolved"], r["workers"]]
        for r in table.iter_rows(named=True)
    ]
    headers = ["pool", "size", "questions", "best worker", "best single", "oracle", "headroom", "unsolved", "workers"]
    return tabulate(rows, headers=headers, tablefmt="github")


@dg.asset(
    group_name=GROUP,
    deps=[pass_rates],
    kinds={"duckdb"},
    automation_condition=dg.AutomationCondition.eager(),
)
def oracle_ceilings(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """Oracle ceiling of the pool, each leave-one-out and best sub-pool of size <= 3, and the null pool."""
    pool_config = pool.load()
    table = pool_ceilings(warehouse.get_warehouse(), pool_config.name, pool_config.worker_names)
    real = table.filter(pl.col("kind") == "pool").row(0, named=True)
    null = table.filter(pl.col("kind") == "null_pool")
    if null.is_empty():
        null_note = (
            "No worker has more than one scored sample per question (e.g. ZeroEval replay records one), so no "
            "null pool can be shown: part of this headroom may be sampling noise that routing cannot exploit."
        )
    else:
        widest = null.sort("size").row(-1, named=True)
        null_note = (
            f"Null pool: {widest['size']} independent samples of {widest['best_worker']} alone show "
            f"{_fmt(widest['headroom'])} headroom, against {_fmt(real['headroom'])} for the real pool. Headroom "
            "not above the null pool's is what resampling one model fakes, not routing signal."
        )
    context.log.info(f"{pool_config.name}: oracle {real['oracle']}, best single {real['best_single']}. {null_note}")
    metadata: dict[str, dg.MetadataValue] = {
        "pool": dg.MetadataValue.text(pool_config.name),
        "n_questions": dg.MetadataValue.int(real["n_questions"] or 0),
        "best_worker": dg.MetadataValue.text(str(real["best_worker"])),
        "best_single": dg.MetadataValue.float(float(real["best_single"] or 0.0)),
        "oracle": dg.MetadataValue.float(float(real["oracle"] or 0.0)),
        "headroom": dg.MetadataValue.float(float(real["headroom"] or 0.0)),
        "unsolved": dg.MetadataValue.int(real["unsolved"] or 0),
        "ceilings": dg.MetadataValue.md(ceilings_markdown(table) + "\n\n" + null_note),
    }
    if not null.is_empty():
        metadata["null_pool_headroom"] = dg.MetadataValue.float(float(null.sort("size")["headroom"][-1]))
    return dg.MaterializeResult(metadata=metadata)


reprobe_job = dg.define_asset_job(
    "reprobe_job",
    selection=[probe_calls],
    description="Probe every worker of the pool again with new sample indices on the same questions",
    config=dg.RunConfig(ops={"probe_calls": ProbeConfig(new_samples=True)}),
)


@dg.schedule(
    job=reprobe_job,
    cron_schedule="0 3 * * *",
    default_status=dg.DefaultScheduleStatus.STOPPED,  # re-probing a hosted pool costs money: opt in
    description="Daily: new samples for every worker so pass-rate intervals tighten",
)
def reprobe_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    return dg.RunRequest(tags=all_probe_partitions_tags())


def all_probe_partitions_tags() -> dict[str, str]:
    """Run tags for one run over every worker partition: the single-run backfill policy probes
    all workers at once."""
    keys = PROBE_PARTITIONS.get_partition_keys()
    return {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}


probing_automation_sensor = dg.AutomationConditionSensorDefinition(
    "probing_automation_sensor",
    target=dg.AssetSelection.assets(pass_rates, oracle_ceilings),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Refreshes pass rates and oracle ceilings once a (re-)probe has landed",
)

PROBING_ASSETS = [probe_calls, pass_rates, oracle_ceilings]
PROBING_JOBS = [reprobe_job]
PROBING_SCHEDULES = [reprobe_schedule]
PROBING_SENSORS = [probing_automation_sensor]
