"""What the corpora hold, as the markdown tables the Dagster UI renders next to each corpus asset."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import polars as pl
from tabulate import tabulate

from conductor_pipeline.records import Question

# The level cell of a question without one: GSM8K, and the two MATH problems labelled "Level ?".
NO_LEVEL = "?"


# What a question is, as frame columns (its text and gold answer left out): what a search or a
# table over a population joins on and groups by.
QUESTION_COLUMNS = {"question_id": pl.String, "corpus": pl.String, "split": pl.String, "subject": pl.String,
                    "level": pl.Int64}


def question_frame(questions: Sequence[Question]) -> pl.DataFrame:
    """The questions as a frame of `QUESTION_COLUMNS`, one row each."""
    return pl.DataFrame([{name: getattr(q, name) for name in QUESTION_COLUMNS} for q in questions],
                        schema=QUESTION_COLUMNS)


def subject_level_table(questions: Iterable[Question]) -> str:
    """A markdown table: one row per subject, one column per level, with totals."""
    counts = Counter((q.subject or "-", q.level) for q in questions)
    levels = sorted({level for _, level in counts if level is not None})
    has_unknown_level = any(level is None for _, level in counts)
    columns: list[int | None] = [*levels, *([None] if has_unknown_level else [])]
    rows = []
    for subject in sorted({subject for subject, _ in counts}):
        cells = [counts.get((subject, level), 0) for level in columns]
        rows.append([subject, *cells, sum(cells)])
    totals = [sum(row[i + 1] for row in rows) for i in range(len(columns) + 1)]
    rows.append(["**total**", *totals])
    headers = ["subject", *(f"L{level}" if level is not None else NO_LEVEL for level in columns), "total"]
    return tabulate(rows, headers=headers, tablefmt="github")


def split_count_table(questions_per_split: Mapping[str, int]) -> str:
    """A markdown table: questions per source split."""
    return tabulate(list(questions_per_split.items()), headers=["split", "questions"], tablefmt="github")


def warehouse_breakdown_table(breakdown: pl.DataFrame) -> str:
    """sql/questions_by_corpus_split_level.sql's frame as markdown; a missing level shows as NO_LEVEL."""
    return tabulate(breakdown.rows(), headers=breakdown.columns, tablefmt="github", missingval=NO_LEVEL)


def population_text(questions: pl.DataFrame) -> str:
    """One line naming a set of questions by corpus, source split and level, e.g.
    "2040 questions (gsm8k test 1319, math test L5 721)".

    `questions` has a `question_id` and a `corpus` column, optionally `split` and `level`; a
    question on several rows counts once. Two figures measured on different populations can only
    be compared once each says which questions it counted.
    """
    keys = [name for name in ("corpus", "split", "level") if name in questions.columns]
    counts = questions.unique("question_id").group_by(keys).agg(n=pl.len()).sort(keys, nulls_last=True)
    parts = []
    for row in counts.iter_rows(named=True):
        level = row.get("level")
        label = [str(row["corpus"])]
        label += [str(row["split"])] if row.get("split") else []
        label += [f"L{level}"] if level is not None else []
        parts.append(f"{' '.join(label)} {row['n']}")
    total = int(counts["n"].sum()) if counts.height else 0
    return f"{total} questions" + (f" ({', '.join(parts)})" if parts else "")
