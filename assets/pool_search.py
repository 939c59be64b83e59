"""Pool search: is there a sub-pool of workers with real routing headroom?

    questions -> pool_search

Searches the sub-pools (sizes 2..6) of a large pool, by default every model ZeroEval recorded
(`replay-zeroeval-all`), for the largest oracle headroom over each sub-pool's own best worker on
the train side of the project's question split, and re-measures the winners on the eval side
(conductor_pipeline/probing/pool_search.py). The outcomes come from one of two sources:

- `recordings` (default): the pool's replay recordings, graded here and cached next to the
  warehouse, so the default run needs no probe of forty workers and a rerun costs seconds;
- `warehouse`: the pool's probe calls (probe it first), where several samples per question let
  the table show each pool's null-pool headroom.

The pool being run (the `pool` resource) and `reference_pools` (by default one model recorded twice,
the stand-in for a null pool when there is one sample per question) are re-measured beside the winners.
"""

import time
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from assets.metadata import stage
from conductor_pipeline.corpora.summaries import question_frame
from conductor_pipeline.files import write_parquet_atomic, write_text_atomic
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.probing.pool_search import PoolSearchError, PoolSearchReport, PoolSearchSettings, search_pools
from conductor_pipeline.probing.pool_search_report import (
    report_markdown,
    search_table_markdown,
    subject_tables_markdown,
    verdict_lines,
    verdict_markdown,
)
from conductor_pipeline.probing.recorded_outcomes import RecordedOutcomesError, recorded_sample_outcomes
from conductor_pipeline.probing.runner import select_questions
from conductor_pipeline.splits import split_fingerprint
from resources.knobs import library_field
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource

GROUP = "pool_search"
DEFAULT_SEARCH_POOL = "replay-zeroeval-all"
# One model recorded twice: with one sample per question there is no null pool, and the headroom of
# such a pair is what recording noise alone (provider, snapshot) produces, a stand-in for it.
SAME_MODEL_TWICE = {
    "same model, two providers (llama-3.1-405b)": ["llama-3.1-405b", "llama-3.1-405b-hyperbolic"],
    "same model, two snapshots (gpt-4o)": ["gpt-4o", "gpt-4o-0513"],
}


class PoolSearchConfig(dg.Config):
    """Which pool and questions to search, and the search's knobs (PoolSearchSettings fields)."""

    pool: str = Field(DEFAULT_SEARCH_POOL, description="Pool whose sub-pools are searched (name or pool file)")
    source: Literal["recordings", "warehouse"] = Field(
        "recordings",
        description="recordings: grade the pool's replay recordings (cached); warehouse: the pool's probe calls",
    )
    corpora: list[str] = Field(["math", "gsm8k"], description="Corpora of the question slice")
    splits: list[str] = Field(["test"], description="Source splits of the question slice")
    math_levels: list[int] = Field([5], description="MATH levels of the slice (GSM8K has none)")
    max_questions: int | None = Field(None, ge=1, description="Cap on the slice (a deterministic mixed sample)")
    reference_pools: dict[str, list[str]] = Field(
        default_factory=lambda: dict(SAME_MODEL_TWICE),
        description="Pools re-measured beside the winners, not searched (the pool being run is always added); "
        "the defaults are one model recorded twice, whose headroom is what recording noise alone gives",
    )
    min_size: int = library_field(PoolSearchSettings, "min_size")
    max_size: int = library_field(PoolSearchSettings, "max_size")
    beam_width: int = library_field(PoolSearchSettings, "beam_width")
    min_coverage: float = library_field(PoolSearchSettings, "min_coverage")
    min_worker_accuracy: float = library_field(PoolSearchSettings, "min_worker_accuracy")
    n_bootstrap: int = library_field(PoolSearchSettings, "n_bootstrap")

    def search_settings(self) -> PoolSearchSettings:
        shared = set(PoolSearchSettings.model_fields) & set(PoolSearchConfig.model_fields)
        return PoolSearchSettings(**{name: getattr(self, name) for name in shared})


@dg.asset(
    **stage(GROUP),
    deps=["questions"],
    kinds={"duckdb", "parquet"},
)
def pool_search(
    context: dg.AssetExecutionContext, config: PoolSearchConfig, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """Sub-pools with the largest oracle headroom over their own best worker: found on train, re-measured on eval."""
    started = time.perf_counter()
    searched_pool = load_pool(config.pool)
    store = warehouse.get_warehouse()
    questions = select_questions(
        store, corpora=config.corpora, splits=config.splits, math_levels=config.math_levels, limit=config.max_questions
    )
    if not questions:
        raise dg.Failure(f"the slice {config.corpora}/{config.splits}/levels {config.math_levels} has no questions; "
                         "materialize `questions` first")
    cached = False
    if config.source == "recordings":
        try:
            outcomes, cached = recorded_sample_outcomes(
                searched_pool, questions, cache_dir=warehouse.artifact_dir("pool_search"), log=context.log.info
            )
        except RecordedOutcomesError as exc:
            raise dg.Failure(str(exc)) from exc
    else:
        outcomes = store.query_file("pool_search_outcomes", {"pool": searched_pool.name})
    outcomes_s = time.perf_counter() - started
    current = pool.load()
    references = dict(config.reference_pools)
    if current.name != searched_pool.name:
        references[current.name] = current.solo_worker_names
    try:
        report = search_pools(outcomes, question_frame(questions), config.search_settings(), reference_pools=references)
    except PoolSearchError as exc:
        raise dg.Failure(f"pool search over {searched_pool.name!r} ({config.source}): {exc}") from exc

    out_dir = warehouse.artifact_dir("pool_search")
    table_path = out_dir / f"{searched_pool.name}-search.parquet"
    write_parquet_atomic(report.table(), table_path, "pool-search table")
    report_path = out_dir / f"{searched_pool.name}-search.md"
    write_text_atomic(report_path, report_markdown(report))
    for line in verdict_lines(report):
        context.log.info(line)
    return dg.MaterializeResult(metadata={
        **pool_search_metadata(report, searched_pool.name, config.source, table_path, report_path),
        "outcomes_cached": dg.MetadataValue.bool(cached),
        "outcomes_seconds": dg.MetadataValue.float(round(outcomes_s, 2)),
        "total_seconds": dg.MetadataValue.float(round(time.perf_counter() - started, 2)),
    })


def pool_search_metadata(
    report: PoolSearchReport, pool: str, source: str, table_path: Path, report_path: Path
) -> dict[str, dg.MetadataValue]:
    """What the UI shows of a search: its population, verdicts, tables and best pool out of sample."""
    metadata = {
        "pool": dg.MetadataValue.text(pool),
        "source": dg.MetadataValue.text(source),
        "search_seconds": dg.MetadataValue.float(round(report.search_seconds, 4)),
        "population": dg.MetadataValue.text(report.population),
        "candidates": dg.MetadataValue.int(len(report.candidates)),
        "train_questions": dg.MetadataValue.int(report.n_train),
        "eval_questions": dg.MetadataValue.int(report.n_eval),
        "split_fingerprint": dg.MetadataValue.text(split_fingerprint()),
        "verdict": dg.MetadataValue.md(verdict_markdown(report)),
        "search_table": dg.MetadataValue.md(search_table_markdown(report)),
        "subject_tables": dg.MetadataValue.md(subject_tables_markdown(report)),
        "table_path": dg.MetadataValue.path(str(table_path)),
        "report_path": dg.MetadataValue.path(str(report_path)),
    }
    best = report.best_out_of_sample
    if best is not None:
        metadata["best_pool"] = dg.MetadataValue.text(", ".join(best.members))
        metadata["best_eval_headroom"] = dg.MetadataValue.float(best.eval.headroom)
    return metadata


POOL_SEARCH_ASSETS = [pool_search]
