"""The corpus assets materialize on the real files and fill the warehouse's `questions` table."""

from __future__ import annotations

import dagster as dg

from assets.corpora import gsm8k_corpus, math500_corpus, math_corpus, questions
from conductor_pipeline.corpora.sources import load_registry
from conductor_pipeline.splits import split_fingerprint
from conductor_pipeline.warehouse import Warehouse
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

ALL_QUESTIONS = 12_500 + 1_319 + 7_473


def _metadata(result: dg.ExecuteInProcessResult, asset_name: str) -> dict:
    [event] = [
        e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey(asset_name)
    ]
    return event.materialization.metadata


def test_materialize_corpora_and_questions_into_the_warehouse(tmp_path, monkeypatch):
    require_shared_data(
        monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train"
    )
    database = tmp_path / "w.duckdb"
    resources = {"warehouse": WarehouseResource(database=str(database))}
    all_assets = [math500_corpus, math_corpus, gsm8k_corpus, questions]

    result = dg.materialize(all_assets, resources=resources)
    assert result.success

    math500 = _metadata(result, "math500_corpus")
    assert math500["rows"].value == 500
    assert math500["sha256"].value == load_registry()["math500_test"].sha256
    assert {"path", "source_url", "subject_level_counts"} <= set(math500)
    assert "| Algebra " in math500["subject_level_counts"].value

    math_full = _metadata(result, "math_corpus")
    assert math_full["rows"].value == 12_500
    assert "| **total** " in math_full["subject_level_counts"].value

    gsm8k = _metadata(result, "gsm8k_corpus")
    assert (gsm8k["rows_train"].value, gsm8k["rows_test"].value, gsm8k["rows"].value) == (7_473, 1_319, 8_792)
    assert gsm8k["sha256_test"].value == load_registry()["gsm8k_test"].sha256

    written = _metadata(result, "questions")
    assert written["rows_written"].value == ALL_QUESTIONS
    assert written["total_rows"].value == ALL_QUESTIONS
    assert written["in_math500"].value == 500
    assert written["split_fingerprint"].value == split_fingerprint()
    assert written["split_train_questions"].value + written["split_eval_questions"].value == ALL_QUESTIONS
    assert "gsm8k" in written["by_corpus_split_level"].value

    warehouse = Warehouse(database)
    counts = warehouse.query(
        "SELECT corpus, split, count(*) AS n, count_if(in_math500) AS m500 FROM questions "
        "GROUP BY ALL ORDER BY ALL"
    )
    assert counts.rows() == [
        ("gsm8k", "test", 1_319, 0),
        ("gsm8k", "train", 7_473, 0),
        ("math", "test", 5_000, 500),
        ("math", "train", 7_500, 0),
    ]
    row = warehouse.query(
        "SELECT answer, subject, level FROM questions WHERE question_id = ?", ["gsm8k:test:0"]
    ).row(0)
    assert row == ("18", None, None)

    # A second run writes nothing new and keeps the total.
    again = dg.materialize([questions], resources=resources)
    assert _metadata(again, "questions")["rows_written"].value == 0
    assert _metadata(again, "questions")["total_rows"].value == ALL_QUESTIONS

