"""Grading: answer extraction from real recorded responses, math equivalence, hostile inputs."""

from __future__ import annotations

import json
import multiprocessing
import re
import threading
import time
from pathlib import Path

import pytest

from conductor_pipeline import grading
from conductor_pipeline.corpora.sources import resolve_data_file
from conductor_pipeline.grading import Grade, extract_answer, grade, grade_many, is_equivalent, normalize_gold, warm_up

HOSTILE_TIMEOUT_S = 1.0
# Generous bound on top of the timeout: the worker is warm, but the 2 cores are shared.
HOSTILE_SLACK_S = 3.0


@pytest.fixture(scope="module", autouse=True)
def warm_workers() -> None:
    warm_up(1)


# --- extraction: literal responses from telemetry/zeroeval_gsm_math-l5_outputs.parquet ----------

# gsm, Athene-70B row 0 (strict JSON), gold "# 18".
ATHENE_GSM_0 = (
    '{\n  "reasoning": "Janet starts with 16 eggs per day. She uses 3 for breakfast and 4 for muffins, '
    "leaving 16 - 3 - 4 = 9 eggs to sell. At $2 per egg, she earns 9 × $2 = $18 daily.\",\n"
    '  "answer": "18"\n}'
)
# math-l5, Athene-70B row 240: raw newlines inside the reasoning string (not valid JSON), and a
# \boxed{52.} inside the reasoning while the answer field says 52.
ATHENE_MATH_240 = (
    '{\n  "reasoning": "\nSince $VY:YW = 4:3$, we have $[VYW] = [PYW] + [PZW] \\Rightarrow [VYW] = 30 + 35 = 65.$\n'
    "By similar triangles, $\\frac{[UXP]}{[PYW]} = \\frac{UX}{VY} = \\frac{7}{4}.$\n"
    'Thus, $[UXP] = \\frac{7}{4} \\cdot 30 = \\boxed{52.}$\n",\n  "answer": "52"\n}'
)
# math-l5, gemma-2-2b-it row 213: fenced, raw newlines, trailing blank after the value.
GEMMA_MATH_213 = (
    '```json\n{\n    "reasoning": "Here\'s how to solve this:\n\n* **For each lamp, Kim has 3 choices of '
    "tables to place it on.** \n* **Since there are 10 lamps, she has 3 * 3 * 3.... (10 times) = 3^10 "
    'total ways to arrange the lamps.**\n\n",\n    "answer": "3^10" \n}\n```'
)
# gsm, command-r row 766: the answer is a bare JSON number.
COMMAND_R_GSM_766 = (
    '```json\n{\n    "reasoning": "Marissa had $80 and the ball cost $20, leaving her with $60. If she spent '
    'all this money on candy bars at $5 each, then she bought 12 candy bars because 60 / 5 = 12.",\n'
    '    "answer": 12\n}\n```'
)
# math-l5, gemini-1.5-pro row 19 (tail): a correctly escaped LaTeX answer field.
GEMINI_MATH_19_TAIL = (
    '= \\\\boxed{\\\\frac{3}{5}}.\\\\]",\n    "answer": "\\\\frac{3}{5}"\n}\n```'
)
# math-l5, Meta-Llama-3-70B-Instruct row 689 (tail): LaTeX in JSON with single backslashes
# (\f of \frac would be a form feed to json.loads).
LLAMA_MATH_689_TAIL = (
    'our answer is $2 \\cos x = \\boxed{\\frac{2}{3}}.$",\n    "answer": "\\frac{2}{3}"\n}\n```'
)
# math-l5, Qwen2.5-3B-Instruct row 424 (tail): a \boxed after the JSON block.
QWEN_MATH_424_TAIL = (
    '"answer": "3"\n}\n```\nThe largest possible value of \\(|a| + |b| + |c|\\) given the constraint '
    "\\(|ax^2 + bx + c| \\le 1\\) for all \\(0 \\le x \\le 1\\) is \\(\\boxed{3}\\)."
)
# gsm, Athene-70B row 963: no answer field, "**Answer:** 157" at the end.
ATHENE_GSM_963_TAIL = (
    "**Stan has 4A - 13 = 4(40) - 13 = 157 catches.**\n\n**Answer:** 157\n}"
)
# gsm, a model quoting a JSON answer inside the answer string.
NESTED_ANSWER_TAIL = '"answer": "`\\"answer\\": \\"187\\"`"\n}\n```\n\nThis correctly reflects the total as 187.'


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (ATHENE_GSM_0, "18"),
        (ATHENE_MATH_240, "52"),
        (GEMMA_MATH_213, "3^10"),
        (COMMAND_R_GSM_766, "12"),
        (GEMINI_MATH_19_TAIL, "\\frac{3}{5}"),
        (LLAMA_MATH_689_TAIL, "\\frac{2}{3}"),
        (QWEN_MATH_424_TAIL, "3"),
        (ATHENE_GSM_963_TAIL, "157"),
        (NESTED_ANSWER_TAIL, "187"),
    ],
)
def test_extracts_answers_real_models_wrote(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


def test_the_last_boxed_wins_and_braces_balance() -> None:
    text = "First \\boxed{1}, then \\boxed{\\frac{1}{\\sqrt{2}}} and finally \\fbox{\\{1, 2\\}}."
    assert extract_answer(text) == "\\{1, 2\\}"
    assert extract_answer("so \\boxed{\\dfrac{3}{4}}") == "\\dfrac{3}{4}"


def test_truncated_box_falls_back_to_the_last_complete_one() -> None:
    assert extract_answer("\\boxed{7} but wait \\boxed{\\frac{1}{2") == "7"


def test_hash_and_trailing_phrases() -> None:
    assert extract_answer("Natalia sold 48/2 = 24 clips in May.\n#### 72") == "72"
    assert extract_answer("... so the final answer is 1,000.") == "1,000"
    assert extract_answer("Work.\nAnswer: $\\frac{1}{2}$") == "$\\frac{1}{2}$"


def test_no_answer_is_none() -> None:
    assert extract_answer("") is None
    assert extract_answer("I am not sure how to solve this.") is None
    assert extract_answer('{"reasoning": "___", "answer": "___"}') is None


def test_normalize_gold_reads_recorded_gsm8k_gold() -> None:
    assert normalize_gold("# 18") == "18"
    assert normalize_gold("#### 1,000") == "1000"
    assert normalize_gold("\\frac{1}{2}") == "\\frac{1}{2}"


def test_real_gsm_responses_read_like_the_recording() -> None:
    """On GSM8K rows where ZeroEval read an answer, the project reads an equivalent one."""
    import polars as pl

    frame = pl.read_parquet(resolve_data_file("zeroeval_outputs"), columns=["benchmark", "output", "answer", "ze_model_answer_raw", "ze_matched"])
    frame = frame.filter(pl.col("benchmark") == "gsm").head(400)
    responses = [json.loads(output)[0] for output in frame["output"]]
    assert frame["answer"][0] == "# 18"
    grades = grade_many(responses, frame["answer"].to_list())
    agreement = sum(g.correct == ze for g, ze in zip(grades, frame["ze_matched"])) / len(grades)
    assert agreement > 0.97


# --- equivalence --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [
        ("0.5", "\\frac{1}{2}"),  # fraction vs decimal
        ("\\dfrac{1}{2}", "\\frac12"),  # \dfrac
        ("\\sqrt{8}", "2\\sqrt{2}"),  # simplified radicals
        ("x^2+2x+1", "(x+1)^2"),  # expanded polynomial
        ("\\{3, 2, 1\\}", "\\{1,2,3\\}"),  # sets regardless of order
        ("(1, 2)", "(1,2)"),  # ordered tuple
        ("[0, 1)", "[0,1)"),  # interval
        ("30^\\circ", "30"),  # degrees
        ("x=4", "4"),  # assignment vs value
        ("1,000", "1000"),  # thousands separator
        ("1000", "#### 1,000"),  # recorded GSM8K gold
        ("18", "# 18"),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),  # matrices
        ("\\begin{pmatrix} 2/4 & 1 \\end{pmatrix}", "\\begin{pmatrix}\\frac{1}{2}&1\\end{pmatrix}"),
        ("(A)", "A"),  # multiple-choice letters
        ("\\text{(B)}", "B"),
        ("\\$18", "18"),  # currency
        ("18 dollars", "18"),  # units
        ("The entire game lasted 53 minutes", "53"),  # prose with the number last
    ],
)
def test_equivalent_forms(predicted: str, gold: str) -> None:
    assert is_equivalent(predicted, gold)


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [
        ("(2, 1)", "(1,2)"),  # tuples are ordered
        ("(0, 1]", "[0,1)"),  # interval ends matter
        ("0.33", "\\frac{1}{3}"),
        ("19", "18"),
        ("B", "A"),
        ("4x^2", "4"),
        ("\\frac{1}{2}", "1"),
        ("", "1"),
    ],
)
def test_different_answers(predicted: str, gold: str) -> None:
    assert not is_equivalent(predicted, gold)


def test_none_is_never_equivalent() -> None:
    assert not is_equivalent(None, "1")
    assert not is_equivalent(None, "")
    assert grade(None, "# 18") == Grade(extracted=None, correct=False)


def test_grade_and_grade_many_agree() -> None:
    responses = [ATHENE_GSM_0, COMMAND_R_GSM_766, None, LLAMA_MATH_689_TAIL, "Answer: 0.5"]
    golds = ["# 18", "# 13", "# 1", "\\frac{2}{3}", "\\frac{1}{2}"]
    batch = grade_many(responses, golds, processes=2)
    assert batch == [grade(r, g) for r, g in zip(responses, golds)]
    assert [g.correct for g in batch] == [True, False, False, True, True]
    with pytest.raises(ValueError):
        grade_many(["1"], [])


# --- hostile inputs -----------------------------------------------------------------------------

HOSTILE = {
    "tower": "10^{10^{10^{10}}}",
    "factorial tower": "((10^{10})!)!",
    "200 KB": "1+" * 100_000 + "1",
    "deep parentheses": "(" * 400 + "1" + ")" * 400,
    "deep braces": "\\frac{" * 300 + "1" + "}{2}" * 300,
}


def _timed(predicted: str) -> tuple[bool, float]:
    started = time.monotonic()
    verdict = is_equivalent(predicted, "7", timeout_s=HOSTILE_TIMEOUT_S)
    return verdict, time.monotonic() - started


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_returns_false_in_time_on_the_main_thread(name: str) -> None:
    verdict, elapsed = _timed(HOSTILE[name])
    assert verdict is False
    assert elapsed < HOSTILE_TIMEOUT_S + HOSTILE_SLACK_S


def test_hostile_inputs_return_false_in_time_from_worker_threads() -> None:
    results: dict[str, tuple[bool, float]] = {}

    def run(name: str) -> None:
        results[name] = _timed(HOSTILE[name])

    threads = [threading.Thread(target=run, args=(name,)) for name in HOSTILE]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert set(results) == set(HOSTILE)
    for name, (verdict, elapsed) in results.items():
        assert verdict is False, name
        assert elapsed < HOSTILE_TIMEOUT_S + HOSTILE_SLACK_S, name
    # The pool still answers correctly after its workers were stopped or replaced.
    assert is_equivalent("\\sqrt{8}", "2\\sqrt{2}")


def _grade_in_daemon_process(_: int) -> list[bool]:
    return [is_equivalent("\\sqrt{8}", "2\\sqrt{2}"), is_equivalent("10^{10^{10^{10}}}", "1", timeout_s=1.0)]


def test_works_inside_a_daemonic_pool_process() -> None:
    """Pool processes may not use multiprocessing children; the worker is a plain subprocess."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.map(_grade_in_daemon_process, [0]) == [[True, False]]


def test_module_never_evaluates_text() -> None:
    forbidden = re.compile(r"\b(eval|exec|sympify|parse_expr)\b")
    for module in (grading, __import__("conductor_pipeline.grading._math_verify_worker", fromlist=["x"])):
        source = Path(module.__file__).read_text()
        assert not forbidden.search(source), module.__name__


def test_the_prompts_example_answer_is_not_the_models_answer() -> None:
    # Phi-3-mini echoes ZeroEval's instruction after its own answer.
    echoed = (
        '{"reasoning": "2 + 8 = 10", "answer": "10"}\nPlease show your final answer in the `answer` '
        'field, e.g.,`"answer": "42"`.\n\n```json\n{\n    "reasoning": "___",\n    "answer": "___"\n}\n```'
    )
    assert extract_answer(echoed) == "10"
