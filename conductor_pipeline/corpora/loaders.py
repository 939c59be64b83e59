"""Load MATH500, the full MATH set and GSM8K into `Question` records, strictly.

`load_*` resolve the registered file through `conductor_pipeline.sources` (so its sha256 is
checked) and parse it; `read_*` parse any file of the same format. Every row is validated:
a malformed row stops the load with the file, the line (1-based, as editors count) or parquet
row, and the field in the message. A silently skipped row would shift GSM8K ids
(`gsm8k:<split>:<line>`, 0-based) and every join after it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl

from conductor_pipeline.corpora.sources import resolve_data_file
from conductor_pipeline.records import Question

GSM8K_SPLITS = ("train", "test")
# The full MATH parquet's columns this module reads, with the polars type each must have.
MATH_FULL_COLUMNS: dict[str, type[pl.DataType]] = {
    "unique_id": pl.String,
    "split": pl.String,
    "type": pl.String,
    "problem": pl.String,
    "level": pl.String,
    "answer_last_boxed": pl.String,
    "in_math500": pl.Boolean,
}
# "Level 1".."Level 5"; two train geometry problems say "Level ?" and get level None.
_MATH_LEVEL_PATTERN = r"^Level (\d+|\?)$"
# A comma between a digit and exactly three digits: a thousands separator ("1,450,000").
_THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_GSM8K_GOLD_MARKER = "####"


class CorpusFormatError(ValueError):
    """A corpus file that does not have the expected shape; names file, line and field."""

    def __init__(self, path: str | Path, location: str, problem: str) -> None:
        self.path = str(path)
        self.location = location
        super().__init__(f"{self.path}, {location}: {problem}")


# ------------------------------------------------------------------------------- JSON lines


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(0-based line index, object) for every line; any line that is not a JSON object fails."""
    with path.open(encoding="utf-8") as handle:
        for index, line in enumerate(handle):
            location = f"line {index + 1}"
            if not line.strip():
                raise CorpusFormatError(path, location, "empty line (every line must be a record)")
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusFormatError(path, location, f"bad JSON: {exc.msg} (column {exc.colno})") from exc
            if not isinstance(row, dict):
                raise CorpusFormatError(path, location, f"expected a JSON object, got {type(row).__name__}")
            yield index, row


def _field(row: dict[str, Any], name: str, kind: type, path: Path, index: int) -> Any:
    """`row[name]`, which must be present and of type `kind` (bool is not an int here)."""
    location = f"line {index + 1}"
    if name not in row:
        raise CorpusFormatError(path, location, f"missing field {name!r}")
    value = row[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorpusFormatError(
            path, location, f"field {name!r} must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


def load_math500(path: str | Path | None = None) -> list[Question]:
    """The 500 MATH500 problems (PRM800K's test split), `in_math500=True`, from the verified file."""
    return read_math500(resolve_data_file("math500_test", path=path))


def read_math500(path: str | Path) -> list[Question]:
    """Parse a MATH500-format JSON-lines file (no registry check: `load_math500` does that)."""
    resolved = Path(path)
    questions = []
    for index, row in _json_lines(resolved):
        unique_id = _field(row, "unique_id", str, resolved, index)
        questions.append(
            Question(
                question_id=unique_id,
                corpus="math",
                split=_math_split(unique_id, resolved, f"line {index + 1}"),
                problem=_field(row, "problem", str, resolved, index),
                answer=_field(row, "answer", str, resolved, index),
                subject=_field(row, "subject", str, resolved, index),
                level=_field(row, "level", int, resolved, index),
                in_math500=True,
            )
        )
    return questions


def gsm8k_gold(solution: str) -> str:
    """The gold answer of a GSM8K solution: the value after the last `####`, without thousands separators."""
    _, marker, value = solution.rpartition(_GSM8K_GOLD_MARKER)
    if not marker:
        raise ValueError(f"no {_GSM8K_GOLD_MARKER!r} marker in the solution")
    gold = _THOUSANDS_SEPARATOR.sub("", value.strip())
    if not gold:
        raise ValueError(f"nothing after {_GSM8K_GOLD_MARKER!r}")
    return gold


def _check_gsm8k_split(split: str) -> None:
    if split not in GSM8K_SPLITS:
        raise ValueError(f"GSM8K split must be one of {GSM8K_SPLITS}, got {split!r}")


def load_gsm8k(split: str, path: str | Path | None = None) -> list[Question]:
    """GSM8K `train` (7,473) or `test` (1,319); ids `gsm8k:<split>:<0-based line>`."""
    _check_gsm8k_split(split)
    return read_gsm8k(resolve_data_file(f"gsm8k_{split}", path=path), split)


def read_gsm8k(path: str | Path, split: str) -> list[Question]:
    """Parse a GSM8K-format JSON-lines file (no registry check: `load_gsm8k` does that)."""
    _check_gsm8k_split(split)
    resolved = Path(path)
    questions = []
    for index, row in _json_lines(resolved):
        solution = _field(row, "answer", str, resolved, index)
        try:
            gold = gsm8k_gold(solution)
        except ValueError as exc:
            raise CorpusFormatError(resolved, f"line {index + 1}", f"field 'answer': {exc}") from exc
        questions.append(
            Question(
                question_id=f"gsm8k:{split}:{index}",
                corpus="gsm8k",
                split=split,
                problem=_field(row, "question", str, resolved, index),
                answer=gold,
            )
        )
    return questions


# ------------------------------------------------------------------------------- MATH parquet


def _math_split(unique_id: str, path: Path, location: str) -> str:
    split = unique_id.split("/", 1)[0]
    if split not in ("train", "test"):
        raise CorpusFormatError(
            path, location, f"unique_id {unique_id!r} does not start with train/ or test/"
        )
    return split


def _refuse_first(bad_rows: pl.Series, path: Path, problem: Callable[[int], str]) -> None:
    """Raise CorpusFormatError for the first row where `bad_rows` is true (0-based parquet row)."""
    if bad_rows.any():
        row = int(bad_rows.arg_true()[0])
        raise CorpusFormatError(path, f"row {row}", problem(row))


def load_math_full(path: str | Path | None = None) -> list[Question]:
    """All 12,500 Hendrycks MATH problems; answer = last `\\boxed{}` of the solution."""
    return read_math_full(resolve_data_file("math_full", path=path))


def read_math_full(path: str | Path) -> list[Question]:
    """Parse a MATH parquet with the shared data's columns (no registry check: `load_math_full` does that)."""
    resolved = Path(path)
    try:
        frame = pl.read_parquet(resolved, columns=list(MATH_FULL_COLUMNS))
    except pl.exceptions.ColumnNotFoundError as exc:
        raise CorpusFormatError(resolved, "schema", f"missing column: {exc}") from exc
    for column, dtype in MATH_FULL_COLUMNS.items():
        if frame.schema[column] != dtype:
            raise CorpusFormatError(
                resolved, "schema", f"field {column!r} must be {dtype}, got {frame.schema[column]}"
            )
        _refuse_first(frame.get_column(column).is_null(), resolved, lambda row: f"field {column!r} is null")

    level_token = frame.get_column("level").str.extract(_MATH_LEVEL_PATTERN, 1)
    _refuse_first(
        level_token.is_null(), resolved, lambda row: f"field 'level' is {frame['level'][row]!r}, not 'Level k'"
    )
    frame = frame.with_columns(
        level=level_token.replace("?", None).cast(pl.Int32),
        split_from_id=pl.col("unique_id").str.split("/").list.first(),
    )
    _refuse_first(
        frame.get_column("split") != frame.get_column("split_from_id"),
        resolved,
        lambda row: f"field 'split' disagrees with unique_id {frame['unique_id'][row]!r}",
    )
    return [
        Question(
            question_id=row["unique_id"],
            corpus="math",
            split=row["split"],
            problem=row["problem"],
            answer=row["answer_last_boxed"],
            subject=row["type"],
            level=row["level"],
            in_math500=row["in_math500"],
        )
        for row in frame.iter_rows(named=True)
    ]


# ------------------------------------------------------------------------------- all of them


def load_all_questions() -> list[Question]:
    """Every question once: MATH (full set, MATH500 rows from their own file) then GSM8K test, train.

    MATH500 is a subset of full MATH; its own file's row wins (it is what MATH500 results are
    graded against) and carries `in_math500=True`.
    """
    by_id: dict[str, Question] = {q.question_id: q for q in load_math_full()}
    for question in load_math500():
        by_id[question.question_id] = question
    for split in ("test", "train"):
        for question in load_gsm8k(split):
            by_id[question.question_id] = question
    return list(by_id.values())
