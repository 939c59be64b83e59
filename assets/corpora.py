"""Corpus assets: validate each public corpus file, then load every question into the warehouse.

The corpus assets pass no data through IO managers: each one resolves its file (sha256
checked), parses every row (malformed input fails the step with file and line), and
publishes what it found as metadata. `questions` writes the merged set into the warehouse,
which is the store every later stage reads.

(No `from __future__ import annotations`: Dagster checks the `context` annotation as a class.)
"""

from collections.abc import Sequence

import dagster as dg

from assets.metadata import stage
from conductor_pipeline.corpora.loaders import load_all_questions, load_gsm8k, load_math500, load_math_full
from conductor_pipeline.corpora.sources import verified_data_file
from conductor_pipeline.corpora.summaries import split_count_table, subject_level_table, warehouse_breakdown_table
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_fingerprint, split_ids
from resources.warehouse import WarehouseResource

GROUP = "corpora"


def _file_metadata(key: str) -> dict[str, dg.MetadataValue]:
    """Where the registered file `key` was found, its (verified) sha256 and its source URL."""
    found = verified_data_file(key)
    return {
        "path": dg.MetadataValue.path(str(found.path)),
        "sha256": dg.MetadataValue.text(found.sha256),
        "source_url": dg.MetadataValue.url(found.source_url),
    }


def _corpus_result(
    context: dg.AssetExecutionContext, source_key: str, questions: Sequence[Question]
) -> dg.MaterializeResult:
    metadata = _file_metadata(source_key)
    context.log.info(f"{source_key}: {len(questions)} rows valid in {metadata['path'].value}")
    return dg.MaterializeResult(
        metadata={
            "rows": dg.MetadataValue.int(len(questions)),
            "subject_level_counts": dg.MetadataValue.md(subject_level_table(questions)),
            **metadata,
        },
        data_version=dg.DataVersion(metadata["sha256"].value),
    )


@dg.asset(**stage(GROUP), kinds={"jsonl"})
def math500_corpus(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    """MATH500 (PRM800K's 500-problem MATH test subset): file verified, every row validated."""
    return _corpus_result(context, "math500_test", load_math500())


@dg.asset(**stage(GROUP), kinds={"parquet"})
def math_corpus(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    """The full Hendrycks MATH set (12,500 problems): file verified, every row validated."""
    return _corpus_result(context, "math_full", load_math_full())


@dg.asset(**stage(GROUP), kinds={"jsonl"})
def gsm8k_corpus(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    """GSM8K train and test: both files verified, every row validated, gold answers extracted."""
    metadata: dict[str, dg.MetadataValue] = {}
    questions_per_split: dict[str, int] = {}
    hashes = []
    for split in ("train", "test"):
        questions = load_gsm8k(split)
        file_metadata = _file_metadata(f"gsm8k_{split}")
        hashes.append(file_metadata["sha256"].value)
        metadata.update({f"{name}_{split}": value for name, value in file_metadata.items()})
        metadata[f"rows_{split}"] = dg.MetadataValue.int(len(questions))
        questions_per_split[split] = len(questions)
        context.log.info(f"gsm8k {split}: {len(questions)} rows valid")
    metadata["rows"] = dg.MetadataValue.int(sum(questions_per_split.values()))
    metadata["split_counts"] = dg.MetadataValue.md(split_count_table(questions_per_split))
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion("+".join(hashes)))


@dg.asset(
    **stage(GROUP), deps=[math500_corpus, math_corpus, gsm8k_corpus], kinds={"duckdb"},
)
def questions(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Every question once (MATH full with MATH500 flagged, GSM8K train and test) in the warehouse table `questions`."""
    loaded = load_all_questions()
    context.log.info(f"loaded {len(loaded)} questions; writing to {warehouse.database}")
    store = warehouse.get_warehouse()
    written = store.insert("questions", loaded)
    total = int(store.query_file("count_questions").item())
    breakdown = store.query_file("questions_by_corpus_split_level")
    context.log.info(f"wrote {written} new questions; the warehouse holds {total}")

    train_ids, eval_ids = split_ids(q.question_id for q in loaded)
    return dg.MaterializeResult(
        metadata={
            "rows_loaded": dg.MetadataValue.int(len(loaded)),
            "rows_written": dg.MetadataValue.int(written),
            "total_rows": dg.MetadataValue.int(total),
            "in_math500": dg.MetadataValue.int(sum(q.in_math500 for q in loaded)),
            "by_corpus_split_level": dg.MetadataValue.md(warehouse_breakdown_table(breakdown)),
            "split_fingerprint": dg.MetadataValue.text(split_fingerprint()),
            "split_train_questions": dg.MetadataValue.int(len(train_ids)),
            "split_eval_questions": dg.MetadataValue.int(len(eval_ids)),
            "warehouse": dg.MetadataValue.path(warehouse.database),
        }
    )


__all__ = ["gsm8k_corpus", "math500_corpus", "math_corpus", "questions"]
