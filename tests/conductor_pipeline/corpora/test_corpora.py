"""Corpus loaders on the real files, and their refusal of malformed input."""

from __future__ import annotations

import json
from collections import Counter

import polars as pl
import pytest

from conductor_pipeline.corpora.loaders import (
    CorpusFormatError,
    gsm8k_gold,
    load_all_questions,
    load_gsm8k,
    load_math500,
    load_math_full,
    read_gsm8k,
    read_math500,
    read_math_full,
)
from conductor_pipeline.corpora.sources import DataIntegrityError
from tests.shared_data import require_shared_data

CORPUS_KEYS = ("math500_test", "math_full", "gsm8k_test", "gsm8k_train")


@pytest.fixture
def shared_data(tmp_path, monkeypatch):
    return require_shared_data(monkeypatch, tmp_path / "cache", *CORPUS_KEYS)


@pytest.fixture(scope="module")
def all_questions(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        require_shared_data(monkeypatch, tmp_path_factory.mktemp("cache"), *CORPUS_KEYS)
        return load_all_questions()


def test_math500_rows_are_typed_and_flagged(shared_data):
    questions = load_math500()
    assert len(questions) == 500
    assert len({q.question_id for q in questions}) == 500
    first = questions[0]
    assert first.question_id == "test/precalculus/807.json"
    assert (first.corpus, first.split, first.level, first.subject) == ("math", "test", 2, "Precalculus")
    assert first.answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert all(q.in_math500 and q.level in range(1, 6) for q in questions)
    assert Counter(q.subject for q in questions)["Algebra"] == 124


def test_math_full_ids_levels_subjects_and_answers(shared_data):
    questions = load_math_full()
    assert len(questions) == 12_500
    by_id = {q.question_id: q for q in questions}
    assert len(by_id) == 12_500
    assert Counter(q.split for q in questions) == {"train": 7_500, "test": 5_000}
    assert sum(q.in_math500 for q in questions) == 500
    assert by_id["test/algebra/1143.json"].answer == "17"
    assert by_id["test/algebra/1143.json"].subject == "Algebra"
    # "Level ?" in the source becomes an unknown level, not a made-up one.
    assert by_id["train/geometry/377.json"].level is None
    assert {q.level for q in questions} == {1, 2, 3, 4, 5, None}
    assert len({q.subject for q in questions}) == 7


def test_math500_rows_agree_with_the_full_set(shared_data):
    full = {q.question_id: q for q in load_math_full()}
    for question in load_math500():
        twin = full[question.question_id]
        assert (twin.problem, twin.answer, twin.subject, twin.level) == (
            question.problem,
            question.answer,
            question.subject,
            question.level,
        )


def test_gsm8k_counts_ids_and_gold_answers(shared_data):
    test = load_gsm8k("test")
    train = load_gsm8k("train")
    assert (len(test), len(train)) == (1_319, 7_473)
    assert test[0].question_id == "gsm8k:test:0"
    assert test[0].answer == "18"
    assert test[0].problem.startswith("Janet")
    assert train[7_472].question_id == "gsm8k:train:7472"
    # Thousands separators are removed: the source says "#### 2,125" and "#### 1,450,000".
    assert test[146].answer == "2125"
    assert test[611].answer == "1450000"
    assert not any("," in q.answer for q in test + train)
    assert all(q.subject is None and q.level is None and not q.in_math500 for q in test)


def test_gsm8k_gold_extraction():
    assert gsm8k_gold("so 3 + 4 = 7\n#### 7") == "7"
    assert gsm8k_gold("#### -1,200") == "-1200"
    assert gsm8k_gold("#### 1,234.5") == "1234.5"
    assert gsm8k_gold("a #### 1 then #### 12,000,000") == "12000000"
    with pytest.raises(ValueError, match="####"):
        gsm8k_gold("no marker here")


def test_all_questions_one_row_per_id(all_questions):
    ids = [q.question_id for q in all_questions]
    assert len(ids) == len(set(ids)) == 12_500 + 1_319 + 7_473
    assert Counter((q.corpus, q.split) for q in all_questions) == {
        ("math", "train"): 7_500,
        ("math", "test"): 5_000,
        ("gsm8k", "train"): 7_473,
        ("gsm8k", "test"): 1_319,
    }
    math500 = [q for q in all_questions if q.in_math500]
    assert len(math500) == 500 and {q.corpus for q in math500} == {"math"}


def test_a_loader_refuses_a_file_that_is_not_the_registered_one(shared_data, tmp_path):
    impostor = tmp_path / "gsm8k_test.jsonl"
    impostor.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    with pytest.raises(DataIntegrityError):
        load_gsm8k("test", path=impostor)
    assert read_gsm8k(impostor, "test")[0].answer == "1"


def _write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD_GSM8K = json.dumps({"question": "How many?", "answer": "2 + 2 = 4\n#### 4"})
GOOD_MATH500 = json.dumps(
    {"problem": "p", "solution": "s", "answer": "1", "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"}
)


def test_bad_json_line_names_file_and_line(tmp_path):
    path = _write_lines(tmp_path / "g.jsonl", [GOOD_GSM8K, GOOD_GSM8K, '{"question": "unterminated'])
    with pytest.raises(CorpusFormatError, match=r"g\.jsonl, line 3: bad JSON") as caught:
        read_gsm8k(path, "test")
    assert str(path) in str(caught.value)


def test_missing_field_names_file_line_and_field(tmp_path):
    path = _write_lines(tmp_path / "g.jsonl", [GOOD_GSM8K, json.dumps({"question": "no answer"})])
    with pytest.raises(CorpusFormatError, match=r"g\.jsonl, line 2: missing field 'answer'"):
        read_gsm8k(path, "train")


def test_wrong_type_and_missing_marker_and_blank_line(tmp_path):
    wrong_level = json.loads(GOOD_MATH500) | {"level": "Level 1"}
    path = _write_lines(tmp_path / "m.jsonl", [GOOD_MATH500, json.dumps(wrong_level)])
    with pytest.raises(CorpusFormatError, match=r"line 2: field 'level' must be int, got str"):
        read_math500(path)

    no_marker = _write_lines(tmp_path / "n.jsonl", [json.dumps({"question": "q", "answer": "42"})])
    with pytest.raises(CorpusFormatError, match=r"line 1: field 'answer': no '####'"):
        read_gsm8k(no_marker, "test")

    blank = _write_lines(tmp_path / "b.jsonl", [GOOD_GSM8K, "", GOOD_GSM8K])
    with pytest.raises(CorpusFormatError, match="line 2: empty line"):
        read_gsm8k(blank, "test")

    not_object = _write_lines(tmp_path / "l.jsonl", ["[1, 2]"])
    with pytest.raises(CorpusFormatError, match="line 1: expected a JSON object"):
        read_gsm8k(not_object, "test")


def _math_frame(**overrides):
    row = {
        "unique_id": "train/algebra/1.json",
        "split": "train",
        "type": "Algebra",
        "problem": "p",
        "level": "Level 3",
        "answer_last_boxed": "5",
        "in_math500": False,
    }
    return pl.DataFrame([row, row | {"unique_id": "train/algebra/2.json"} | overrides])


def test_math_parquet_problems_name_file_row_and_field(tmp_path):
    path = tmp_path / "math.parquet"
    _math_frame().write_parquet(path)
    assert [q.level for q in read_math_full(path)] == [3, 3]

    _math_frame(level="Hard").write_parquet(path)
    with pytest.raises(CorpusFormatError, match=r"math\.parquet, row 1: field 'level' is 'Hard'"):
        read_math_full(path)

    _math_frame(answer_last_boxed=None).write_parquet(path)
    with pytest.raises(CorpusFormatError, match=r"row 1: field 'answer_last_boxed' is null"):
        read_math_full(path)

    _math_frame().drop("type").write_parquet(path)
    with pytest.raises(CorpusFormatError, match=r"schema: missing column"):
        read_math_full(path)

    _math_frame().with_columns(pl.col("in_math500").cast(pl.Int64)).write_parquet(path)
    with pytest.raises(CorpusFormatError, match=r"field 'in_math500' must be Boolean"):
        read_math_full(path)

    _math_frame(split="test").write_parquet(path)
    with pytest.raises(CorpusFormatError, match=r"row 1: field 'split' disagrees"):
        read_math_full(path)
