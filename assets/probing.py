"""Probing assets: probe the pool k times per question, then pass rates and oracle ceilings.

`probe_calls` is partitioned by worker, so it is built for one pool (`pool_probing_definitions`,
with the schedule that re-probes every partition). With a single-run backfill policy one run
probes every selected worker concurrently through one governor; the library writes each call to
the warehouse as it completes and skips calls already written, so a rerun after a kill resumes.
`reprobe_schedule` adds new sample indices on the same questions; an eager automation condition
(evaluated by `probing_automation_sensor`) refreshes pass rates and ceilings after it.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg
import polars as pl
from pydantic import Field

from assets.metadata import png_markdown, stage
from assets.versions import probe_calls_data_version
from conductor_pipeline.corpora.summaries import population_text
from conductor_pipeline.files import write_bytes_atomic, write_parquet_atomic
from conductor_pipeline.grading.regrade import StaleGradesError
from conductor_pipeline.pools.config import PoolConfig, load_pool
from conductor_pipeline.probing.ceilings import pool_ceilings, whole_pool_row, widest_null_pool_row
from conductor_pipeline.probing.pass_rates import pass_rate_table, worker_summary
from conductor_pipeline.probing.plots import pass_rate_plot
from conductor_pipeline.probing.reports import (
    accuracy_markdown,
    ceilings_markdown,
    null_pool_note,
    status_count_markdown,
    status_rate_markdown,
    worker_pass_rate_histogram_markdown,
)
from conductor_pipeline.probing.runner import ProbeSummary, next_sample_offset, probe_and_close, select_questions
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource

GROUP = "probing"
PROBE_CALLS = "probe_calls"


class ProbeConfig(dg.Config):
    """What to probe: the question slice, samples per question and decoding temperature."""

    samples: int = Field(6, ge=1, description="Samples per question x worker (one sample is a coin flip)")
    temperature: float = Field(
        0.2, ge=0, description="Sampling temperature of every probe call (a seat's default for workflow steps)"
    )
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


def probe_partitions(pool: str) -> dg.StaticPartitionsDefinition:
    """One partition per worker of `pool` (a pool name under data/pools/ or a pool file) that
    answers alone: a conductor or vote seat has nothing to answer by itself, so it is not probed."""
    return dg.StaticPartitionsDefinition(load_pool(pool).solo_worker_names)


def all_probe_partitions_tags(partitions: dg.PartitionsDefinition) -> dict[str, str]:
    """Run tags for one run over every worker partition: the single-run backfill policy probes
    all workers at once."""
    keys = partitions.get_partition_keys()
    return {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}


def probed_partitions(partition_keys: Sequence[str], pool_config: PoolConfig, pool_name: str) -> list[str]:
    """The run's worker partitions, each a worker of the pool that answers alone (else the
    definitions were built for another pool than the resource reads)."""
    unknown = sorted(set(partition_keys) - set(pool_config.solo_worker_names))
    if unknown:
        raise dg.Failure(
            f"partitions {unknown} are not probed workers of pool {pool_config.name!r} "
            f"({pool_config.solo_worker_names}); the definitions were built for pool {pool_name!r}: "
            "set CORYPHAEUS_POOL consistently"
        )
    return list(partition_keys)


def probe_calls_metadata(
    pool: str, workers: Sequence[str], sample_offset: int, samples: int, summary: ProbeSummary
) -> dict[str, dg.MetadataValue]:
    """What a probe wrote, planned and found already written, per worker and status, and how fast."""
    return {
        "pool": dg.MetadataValue.text(pool),
        "workers": dg.MetadataValue.json(list(workers)),
        "calls_written": dg.MetadataValue.int(summary.written),
        "calls_planned": dg.MetadataValue.int(summary.planned),
        "already_written": dg.MetadataValue.int(summary.already_done),
        "skipped_unrecorded": dg.MetadataValue.int(summary.skipped_unrecorded),
        "samples": dg.MetadataValue.text(f"{sample_offset}..{sample_offset + samples - 1}"),
        "status_counts": dg.MetadataValue.md(status_count_markdown(summary.per_worker_status)),
        "calls_per_second": dg.MetadataValue.float(round(summary.rate_per_s, 1)),
        "elapsed_s": dg.MetadataValue.float(round(summary.elapsed_s, 2)),
    }


def build_probe_calls(pool_name: str, partitions: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    """The `probe_calls` asset for the definitions of pool `pool_name`, partitioned by `partitions`."""

    @dg.asset(
        name=PROBE_CALLS,
        **stage(GROUP),
        partitions_def=partitions,
        backfill_policy=dg.BackfillPolicy.single_run(),
        deps=["questions"],
        kinds={"duckdb"},
    )
    def probe_calls(
        context: dg.AssetExecutionContext, config: ProbeConfig, warehouse: WarehouseResource, pool: PoolResource
    ) -> dg.MaterializeResult:
        """Every (question, worker, sample) probe call of the slice, graded and written as it completes."""
        pool_config = pool.load()
        selected = probed_partitions(context.partition_keys, pool_config, pool_name)
        not_probed = [seat.name for seat in pool_config.workers if not seat.answers_alone]
        if not_probed:
            context.log.info(f"not probed (they answer only within a workflow, never alone): {not_probed}")
        store = warehouse.get_warehouse()
        sample_offset = next_sample_offset(store, pool_config.name) if config.new_samples else config.sample_offset
        workers = pool.build_workers(selected)  # fails here, before any call, when an API key is unset
        questions = select_questions(
            store,
            corpora=config.corpora,
            splits=config.splits,
            math_levels=config.math_levels,
            limit=config.max_questions,
        )
        if not questions:
            raise dg.Failure(f"the slice {config.corpora}/{config.splits}/levels {config.math_levels} has no "
                             "questions; materialize `questions` first")
        summary = probe_and_close(
            store,
            pool_config,
            workers,
            questions,
            samples=config.samples,
            sample_offset=sample_offset,
            temperature=config.temperature,
            run_id=context.run_id,
            governor_factory=pool.governor,
            log=context.log.info,
            batch_size=config.batch_size,
            only_recorded=config.only_recorded,
        )
        context.log.info(
            f"probe {pool_config.name}: wrote {summary.written} calls in {summary.elapsed_s:.1f}s "
            f"({summary.rate_per_s:.0f}/s); {summary.already_done} were already written"
        )
        return dg.MaterializeResult(
            metadata=probe_calls_metadata(pool_config.name, selected, sample_offset, config.samples, summary),
            data_version=probe_calls_data_version(store, pool_config.name),
        )

    return probe_calls


@dg.asset(
    **stage(GROUP),
    deps=[PROBE_CALLS],
    kinds={"duckdb", "parquet"},
    automation_condition=dg.AutomationCondition.eager(),
)
def pass_rates(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """Per question x worker pass rates with 95% intervals; per worker accuracy, status rates, tokens, cost."""
    pool_config = pool.load()
    store = warehouse.get_warehouse()
    try:
        rates = pass_rate_table(store, pool_config.name).filter(pl.col("worker").is_in(pool_config.solo_worker_names))
    except StaleGradesError as exc:
        raise dg.Failure(str(exc)) from exc
    summary = worker_summary(store, pool_config.name).filter(pl.col("worker").is_in(pool_config.solo_worker_names))
    if rates.is_empty():
        raise dg.Failure(f"no scored probe calls for pool {pool_config.name!r}: materialize probe_calls first")
    workers = [w for w in pool_config.solo_worker_names if w in set(summary["worker"].to_list())]
    out_dir = warehouse.artifact_dir("pass_rates")
    table_path = out_dir / f"{pool_config.name}.parquet"
    write_parquet_atomic(rates, table_path, "pass-rate table")
    png = pass_rate_plot(rates, workers, f"{pool_config.name}: pass-rate distribution per worker")
    plot_path = out_dir / f"{pool_config.name}.png"
    write_bytes_atomic(plot_path, png, "pass-rate plot")
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
            "pass_rate_histogram": dg.MetadataValue.md(worker_pass_rate_histogram_markdown(rates, workers)),
            "pass_rate_plot": png_markdown(png, "pass-rate distribution per worker"),
            "pass_rate_plot_path": dg.MetadataValue.path(str(plot_path)),
            "table_path": dg.MetadataValue.path(str(table_path)),
        }
    )


@dg.asset(
    **stage(GROUP),
    deps=[pass_rates],
    kinds={"duckdb"},
    automation_condition=dg.AutomationCondition.eager(),
)
def oracle_ceilings(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """Oracle ceiling of the pool, each leave-one-out and best sub-pool of size <= 3, and the null pool."""
    pool_config = pool.load()
    store = warehouse.get_warehouse()
    try:
        table = pool_ceilings(store, pool_config.name, pool_config.solo_worker_names)
    except StaleGradesError as exc:
        raise dg.Failure(str(exc)) from exc
    real = whole_pool_row(table)
    widest_null = widest_null_pool_row(table)
    note = null_pool_note(real, widest_null)
    population = store.query_file("pool_population", {"pool": pool_config.name, "workers": pool_config.solo_worker_names})
    population_line = (
        f"Population: {population_text(population)}, every probed question of the pool that all its workers "
        "answered, on both sides of the project's train/eval split."
    )
    context.log.info(f"{pool_config.name}: oracle {real['oracle']}, best single {real['best_single']}. {note}")
    metadata: dict[str, dg.MetadataValue] = {
        "pool": dg.MetadataValue.text(pool_config.name),
        "n_questions": dg.MetadataValue.int(real["n_questions"] or 0),
        "best_worker": dg.MetadataValue.text(str(real["best_worker"])),
        "best_single": dg.MetadataValue.float(float(real["best_single"] or 0.0)),
        "oracle": dg.MetadataValue.float(float(real["oracle"] or 0.0)),
        "headroom": dg.MetadataValue.float(float(real["headroom"] or 0.0)),
        "unsolved": dg.MetadataValue.int(real["unsolved"] or 0),
        "population": dg.MetadataValue.text(population_line),
        "ceilings": dg.MetadataValue.md(ceilings_markdown(table) + "\n\n" + population_line + "\n\n" + note),
    }
    if widest_null is not None:
        metadata["null_pool_headroom"] = dg.MetadataValue.float(float(widest_null["headroom"]))
    return dg.MaterializeResult(metadata=metadata)


reprobe_job = dg.define_asset_job(
    "reprobe_job",
    selection=[PROBE_CALLS],
    description="Probe every worker of the pool again with new sample indices on the same questions",
    config=dg.RunConfig(ops={PROBE_CALLS: ProbeConfig(new_samples=True)}),
)


def build_reprobe_schedule(partitions: dg.PartitionsDefinition) -> dg.ScheduleDefinition:
    """The daily re-probe of every worker partition."""

    @dg.schedule(
        job=reprobe_job,
        cron_schedule="0 3 * * *",
        default_status=dg.DefaultScheduleStatus.STOPPED,  # re-probing a hosted pool costs money: opt in
        description="Daily: new samples for every worker so pass-rate intervals tighten",
    )
    def reprobe_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        return dg.RunRequest(tags=all_probe_partitions_tags(partitions))

    return reprobe_schedule


probing_automation_sensor = dg.AutomationConditionSensorDefinition(
    "probing_automation_sensor",
    target=dg.AssetSelection.assets(pass_rates, oracle_ceilings),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Refreshes pass rates and oracle ceilings once a (re-)probe has landed",
)

PROBING_JOBS = [reprobe_job]
PROBING_SENSORS = [probing_automation_sensor]


@dataclass(frozen=True)
class PoolProbingDefinitions:
    """What of the probing stage is built for one pool: the partitions are the pool's workers."""

    partitions: dg.StaticPartitionsDefinition
    probe_calls: dg.AssetsDefinition
    reprobe_schedule: dg.ScheduleDefinition


def pool_probing_definitions(pool: str) -> PoolProbingDefinitions:
    """`probe_calls` partitioned by the workers of `pool`, and the schedule that re-probes them all."""
    partitions = probe_partitions(pool)
    return PoolProbingDefinitions(partitions, build_probe_calls(pool, partitions), build_reprobe_schedule(partitions))
