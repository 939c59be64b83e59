"""The markdown summaries the corpus assets publish."""

from __future__ import annotations

import polars as pl

from conductor_pipeline.corpora.summaries import (
    population_text,
    split_count_table,
    subject_level_table,
    warehouse_breakdown_table,
)
from conductor_pipeline.records import Question


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_subject_level_table_has_a_column_per_level_and_totals():
    rows = [
        Question("a", "math", "test", "p", "1", "Algebra", 1),
        Question("b", "math", "test", "p", "1", "Algebra", 3),
        Question("c", "math", "test", "p", "1", "Geometry", None),
    ]
    table = subject_level_table(rows)
    lines = table.splitlines()
    assert [cell.strip() for cell in lines[0].strip("|").split("|")] == ["subject", "L1", "L3", "?", "total"]
    assert [cell.strip() for cell in lines[-1].strip("|").split("|")] == ["**total**", "1", "1", "1", "3"]


def test_split_counts_and_a_missing_level_shown_as_unknown():
    assert [cells(line) for line in split_count_table({"train": 3, "test": 2}).splitlines()[2:]] == [
        ["train", "3"], ["test", "2"]
    ]
    breakdown = pl.DataFrame({"corpus": ["gsm8k", "math"], "level": [None, 5], "questions": [7, 2]})
    lines = warehouse_breakdown_table(breakdown).splitlines()
    assert cells(lines[0]) == ["corpus", "level", "questions"]
    assert cells(lines[2]) == ["gsm8k", "?", "7"] and cells(lines[3]) == ["math", "5", "2"]


def test_population_text_counts_each_question_once_by_corpus_split_and_level():
    frame = pl.DataFrame({
        "question_id": ["a", "b", "b", "g1", "g2"],
        "corpus": ["math", "math", "math", "gsm8k", "gsm8k"],
        "split": ["test"] * 5,
        "level": [5, 4, 4, None, None],
    })
    assert population_text(frame) == "4 questions (gsm8k test 2, math test L4 1, math test L5 1)"
    assert population_text(frame.drop("split", "level")) == "4 questions (gsm8k 2, math 2)"
    assert population_text(frame.clear()) == "0 questions"
