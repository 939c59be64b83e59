"""The extraction rules beyond "the last box": boxes listed together, a final-answer sentence after
the last box, a math span closing the response, a bare answer; and what each still refuses."""

from __future__ import annotations

import time

import pytest

from conductor_pipeline.grading import grade, is_equivalent, read_answer, warm_up
from conductor_pipeline.grading.extraction import extract_answer

# Linear scans only: hostile text must not make extraction slow (the grader's deadline covers
# math-verify, not extraction, which runs in the caller's process). Counted in this process's CPU
# seconds, not wall time: a busy machine slows a linear scan, a backtracking one takes minutes.
EXTRACT_BOUND_S = 2.0


@pytest.fixture(scope="module", autouse=True)
def warm_workers() -> None:
    warm_up(1)


# --- several boxes answering one question -------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Factoring, the two roots are \\boxed{-2} and \\boxed{3}.", "-2, 3"),
        ("The solutions: \\boxed{4}, \\boxed{9}, \\boxed{16}", "4, 9, 16"),
        ("$$\\boxed{(0, 1)} \\quad \\text{and} \\quad \\boxed{(5, 2)}$$", "(0, 1), (5, 2)"),
        ("\\[\n\\boxed{(1, 1)},\n\\boxed{(4, -2)}\n\\]", "(1, 1), (4, -2)"),
        ("so $a = \\boxed{6}$ and $b = \\boxed{-1}$", "6, -1"),
        ("\\boxed{12} \\text{ for part (a) and } \\boxed{7}", "12, 7"),
        ("\\boxed{5} or \\boxed{-5}, \\boxed{5}", "5, -5"),  # a repeated box counts once
    ],
)
def test_boxes_listed_together_are_one_answer(response: str, expected: str) -> None:
    assert read_answer(response) == (expected, "boxes")
    assert read_answer("\\boxed{5} or \\boxed{5}") == ("5", "box")


def test_listed_boxes_grade_as_a_set_against_the_gold() -> None:
    assert grade("Factoring, the two roots are \\boxed{-2} and \\boxed{3}.", "3, -2").correct
    assert grade("\\boxed{(2, 0)}, \\boxed{(0, 2)}", "(0,2),(2,0)").correct
    assert not grade("Factoring, the two roots are \\boxed{-2} and \\boxed{3}.", "3").correct
    assert not grade("\\boxed{(2, 0)}, \\boxed{(0, 2)}", "(0,2)").correct


@pytest.mark.parametrize(
    "response",
    [
        # a draft box, then the final one after prose
        "First try gives \\boxed{14}. Checking the units digit, that is wrong; recount: \\boxed{15}",
        # a paragraph break is a new statement even when no word separates the boxes
        "\\boxed{14}\n\n\\boxed{15}",
        # a long gap
        "\\boxed{14}" + " " * 60 + "\\boxed{15}",
        # an intermediate list of values, then the final box after prose
        "We find \\boxed{x = 3}, \\boxed{y = 4}. Therefore the requested sum x + y is \\boxed{15}",
    ],
)
def test_a_box_after_prose_is_the_answer_alone(response: str) -> None:
    assert read_answer(response) == ("15", "box")


# --- a closing final-answer sentence after an earlier box ----------------------------------------


def test_a_final_answer_sentence_after_the_last_box_wins() -> None:
    response = (
        "The first account earns $0.05 \\cdot 8000 = \\boxed{400}$ in interest. Adding the principal, "
        "the balance is $8000 + 400 = 8400$.\nFinal Answer: The final answer is $8,400$. I hope it is correct."
    )
    assert read_answer(response) == ("$8,400$", "final_answer_after_box")
    assert grade(response, "8400").correct
    assert extract_answer("Sum: \\boxed{3}. So the final answer is 7.") == "7"


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{9}\nThe final answer is found by adding the two roots together.",  # prose, not a value
        'Thus \\boxed{9}.\nThe final answer is:\n```json\n{"answer": "9"}\n```',  # a code block, not a value
        "The final answer is $\\boxed{9}$.",  # the marker introduces the box itself
    ],
)
def test_the_box_stays_when_no_value_follows_the_marker(response: str) -> None:
    assert extract_answer(response) == "9"


# --- an unboxed math span closing the prose ------------------------------------------------------

# math-l5, Qwen2.5-3B-Instruct row 64721 (tail): a JSON answer field written as prose, then a
# closing sentence whose only math is the answer.
QWEN_MATH_64721_TAIL = (
    "Therefore, the sum of the constant terms \\(a\\) and \\(b\\) is 4.\n\n   **answer**: \"4\"\n}\n```\n"
    "The sum of the constant terms of Eric's and Charles's polynomials is \\(4\\)."
)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Substituting back, $y = 8 - 2 = 6$, so the pair that solves the system is $(1, 6)$.", "(1, 6)"),
        ("Hence the perimeter is \\[ 12 + 4\\sqrt{2} \\]", "12 + 4\\sqrt{2}"),
        ("So the probability is $\\frac{3}{8}$! <|im_end|>", "\\frac{3}{8}"),
        ("The ordered pair is $(2, 5)$. <|im_start|>user", "(2, 5)"),
        ("$$x \\in (1, +\\infty)$$", "x \\in (1, +\\infty)"),
        (QWEN_MATH_64721_TAIL, "4"),
    ],
)
def test_a_math_span_closing_the_response_is_read(response: str, expected: str) -> None:
    assert read_answer(response) == (expected, "closing_span")


def test_an_inline_span_may_cross_single_line_breaks() -> None:
    # TeX reads a line break inside math as a space, so this is the number 9: accepted (the
    # math-verify suite expects a refusal here; the answer is unambiguous, so the grader reads it).
    assert read_answer("Answer $ \n 9 \n $") == ("9", "closing_span")
    assert read_answer("Answer \\( \n 9 \n \\)") == ("9", "closing_span")
    # A blank line is a paragraph break, which TeX rejects inside math: no span.
    assert extract_answer("It costs $4.\n\nSo the total in dollars is 12 $") is None


@pytest.mark.parametrize(
    "response",
    [
        # cut off mid-derivation right after an inline variable: no full stop, not the whole response
        "We now need the remaining coefficient. Expanding the product term by term and collecting powers of $x$",
        # words follow the span
        "Therefore $x \\geq 5$ is the solution.",
        # two prices, not a span
        "The pen costs $3 and the notebook costs $",
        # the last span is followed by more derivation
        "We get $k = 4$. Then substituting into the first equation gives",
    ],
)
def test_no_closing_span(response: str) -> None:
    assert extract_answer(response) is None


# --- a response that is only a short answer ------------------------------------------------------


@pytest.mark.parametrize(("response", "expected"), [("42", "42"), (" \\frac{10}{9} \n", "\\frac{10}{9}"), ("-3.5.", "-3.5")])
def test_a_bare_answer_is_the_answer(response: str, expected: str) -> None:
    assert read_answer(response) == (expected, "bare")


@pytest.mark.parametrize(
    "response",
    ["I cannot solve this one.", '{"answer": "___"}', "Let me think about this problem step by step first", "..."],
)
def test_prose_and_templates_are_not_bare_answers(response: str) -> None:
    assert extract_answer(response) is None


# --- the earlier rules keep their precedence ------------------------------------------------------


def test_rule_names_and_precedence() -> None:
    assert read_answer(None) == (None, "none")
    assert read_answer("\\boxed{3}") == ("3", "box")
    assert read_answer('{"reasoning": "so 2+1", "answer": "3"}') == ("3", "json")
    assert read_answer('{"reasoning": "so", "answer": "\\\\boxed{3} and \\\\boxed{4}"}') == ("3, 4", "json_box")
    assert read_answer("48/2 = 24\n#### 72") == ("72", "hash")
    # a trailing phrase is read up to its full stop
    assert read_answer("Adding up. The final answer is 10. I hope it is correct.") == ("10", "phrase")
    assert read_answer("So the answer is 3.5 m.") == ("3.5 m", "phrase")
    # a phrase beats a closing span; a box inside the JSON text defers to the field
    assert read_answer("Answer: 7 and the last span is $8$.") == ("7 and the last span is $8$", "phrase")


# --- equivalence of what the new rules produce ---------------------------------------------------


def test_a_listing_comma_is_not_a_thousands_separator() -> None:
    assert not is_equivalent("2, 500", "2500")
    assert is_equivalent("2,500", "2500")
    assert is_equivalent("-2, 3", "3, -2")
    assert is_equivalent("(1, 2), (3, 4)", "(3,4),(1,2)")


# --- hostile text stays linear --------------------------------------------------------------------


@pytest.mark.parametrize(
    "hostile",
    [
        "\\boxed{" * 20_000,
        "\\boxed{1} and " * 20_000,
        "$" * 200_000,
        "\\(" * 100_000,
        "$a$ " * 50_000 + "final answer is " * 10_000,
        "Final answer: \\boxed{1}" + " final answer is" * 20_000,
        "<|a|> " * 50_000 + "x",
        "<|a|>" + " " * 100_000 + "$x",
        "So it is $" + "a" * 100_000 + "$.",
    ],
)
def test_extraction_of_hostile_text_is_fast(hostile: str) -> None:
    started = time.process_time()
    read_answer(hostile)
    assert time.process_time() - started < EXTRACT_BOUND_S
