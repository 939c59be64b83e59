"""Hostile input: fuzz the workflow parser and the grader with hypothesis.

Properties: no exception other than the documented one (`WorkflowParseError` for the parser;
the grader never raises), no call longer than its bound (the grader's `timeout_s` plus slack;
the parser has no timeout, so a generous per-call bound that a linear parser never nears), and
nothing executed: inputs carry code payloads that would create a marker file if anything
`eval`ed, `exec`ed or `sympify`ed them (in this process or in math-verify's worker processes).

The number of inputs tried is printed (`-s`) and recorded in benchmarks/RESULTS-reliability.md.
Scale the example counts with FUZZ_SCALE (e.g. FUZZ_SCALE=10 for a longer run).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor_pipeline.grading import extract_answer, grade, is_equivalent, warm_up
from conductor_pipeline.workflow import PARSE_CODES, Workflow, WorkflowParseError, parse_workflow

SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
PARSER_EXAMPLES = int(1500 * SCALE)
EXTRACT_EXAMPLES = int(1000 * SCALE)
EQUIVALENCE_EXAMPLES = int(120 * SCALE)
GRADER_TIMEOUT_S = 1.0
# Shared 2-core box: slack on top of the grader's deadline (a replaced worker restarts sympy).
GRADER_SLACK_S = 6.0
# The parser is linear in its input; a CPU second per call (this process's, so a busy machine does
# not count) means something went quadratic or worse.
PARSER_BOUND_S = 1.0
EXTRACT_BOUND_S = 1.0
WORKERS = ["Model 0", "Model 1", "Model 2"]
# Where payloads would write if executed; a fixed path so worker processes see the same one.
MARKER = Path(f"/tmp/coryphaeus_fuzz_PWNED_{os.getpid()}")
PAYLOADS = [
    f"__import__('os').system('touch {MARKER}')",
    f"__import__('pathlib').Path('{MARKER}').touch()",
    f"exec(\"open('{MARKER}', 'w')\")",
    f"eval(compile('open(\"{MARKER}\", \"w\")', 'x', 'exec'))",
    f"Symbol('x').__class__.__mro__[-1].__subclasses__() or open('{MARKER}','w')",
    f"(lambda: __import__('subprocess').run(['touch', '{MARKER}']))()",
]
TRIED: Counter[str] = Counter()

WORKFLOW_FRAGMENTS = [
    "model_id", "subtasks", "access_list", " = ", "=", "[", "]", "{", "}", '"steps"', '"worker"',
    '"subtask"', '"sees"', ":", ",", "'", '"', "\\", '"all"', "'all'", "0", "1", "2", "-1", "99",
    '"Model 0"', "'Model 1'", "Model 2", "#", "\n", "```json\n", "```", "True", "None", "1e999",
    "...", "\\u0000", "\\x41", "'''", "b'x'", "f'{x}'", " ", "\t", "my_model_id", ".model_id",
    "[" * 50, "]" * 50, *PAYLOADS,
]
ANSWER_FRAGMENTS = [
    "\\boxed{", "\\fbox{", "}", "{", "\\frac", "\\dfrac", "^", "10", "7", "!", "(", ")", "\\sqrt", "Answer:",
    "The final answer is ", "answer is", "#### ", '"answer": ', '{"answer": "', '"}', "x", "=", "\\begin{pmatrix}",
    "&", "\\\\", "9**9**9", "10^{10^{10}}", "\\infty", "\\pi", "$", "\\(", "\\)", "\\text{", "%", ",", ".",
    "\\left(", "\\right)", "1/0", "0.5", "-", "+", "\\cdot", "I hope it is correct", "\n", *PAYLOADS,
]


def fragments(pieces: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(pieces), max_size=40).map("".join)


def mutated_workflow() -> st.SearchStrategy[str]:
    """A valid workflow text with a few characters replaced or removed: the near misses."""
    base = (
        'Let me plan.\nmodel_id = ["Model 0", 1, "Model 2"]\n'
        'subtasks = ["Solve it.", "Check step 0.", "Box the answer."]\naccess_list = [[], "all", [0, 1]]'
    )

    @st.composite
    def build(draw: st.DrawFn) -> str:
        text = base
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(text)))
            insert = draw(st.sampled_from(["", *WORKFLOW_FRAGMENTS, draw(st.text(max_size=3))]))
            cut = draw(st.integers(0, 3))
            text = text[:at] + insert + text[at + cut:]
        return text

    return build()


WORKFLOW_TEXT = st.one_of(st.text(max_size=300), fragments(WORKFLOW_FRAGMENTS), mutated_workflow())
ANSWER_TEXT = st.one_of(st.text(max_size=200), fragments(ANSWER_FRAGMENTS))


@pytest.fixture(scope="module", autouse=True)
def no_marker_and_report():
    MARKER.unlink(missing_ok=True)
    warm_up(1)
    yield
    print(f"\nfuzz inputs tried: {dict(TRIED)} (total {sum(TRIED.values())})")
    assert not MARKER.exists(), "a fuzz payload was executed"


@settings(max_examples=PARSER_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=WORKFLOW_TEXT, allow_empty=st.booleans())
def test_parser_raises_only_its_documented_error(text: str, allow_empty: bool) -> None:
    TRIED["parse_workflow"] += 1
    started = time.process_time()
    try:
        result = parse_workflow(text, WORKERS, allow_empty=allow_empty)
    except WorkflowParseError as exc:
        assert exc.code in PARSE_CODES
    else:
        assert isinstance(result, Workflow)
        assert all(step.worker in WORKERS for step in result.steps)
        assert all(all(seen < i for seen in step.sees) for i, step in enumerate(result.steps))
    assert time.process_time() - started < PARSER_BOUND_S
    assert not MARKER.exists()


@settings(max_examples=EXTRACT_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=ANSWER_TEXT)
def test_extraction_never_raises(text: str) -> None:
    TRIED["extract_answer"] += 1
    started = time.process_time()
    answer = extract_answer(text)
    assert answer is None or isinstance(answer, str)
    assert time.process_time() - started < EXTRACT_BOUND_S
    assert not MARKER.exists()


@settings(max_examples=EQUIVALENCE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(predicted=ANSWER_TEXT, gold=st.one_of(st.sampled_from(["7", "\\frac{1}{2}", "2\\sqrt{2}", "x^2+1"]),
                                              fragments(ANSWER_FRAGMENTS)))
def test_equivalence_returns_a_bool_within_its_timeout(predicted: str, gold: str) -> None:
    TRIED["is_equivalent"] += 1
    started = time.monotonic()
    verdict = is_equivalent(predicted, gold, timeout_s=GRADER_TIMEOUT_S)
    assert isinstance(verdict, bool)
    assert time.monotonic() - started < GRADER_TIMEOUT_S + GRADER_SLACK_S
    assert not MARKER.exists()


# Ids without the process id, so every xdist worker collects the same test ids.
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda payload: payload.replace(str(MARKER), "MARKER"))
def test_code_payloads_are_never_executed(payload: str) -> None:
    """Each payload where a parser or grader would most plausibly evaluate it."""
    texts = [
        f"\\boxed{{{payload}}}", f"The final answer is {payload}", f'{{"answer": "{payload}"}}',
        f"Answer: ${payload}$", f"#### {payload}", f"model_id = [{payload}]\nsubtasks = ['a']\naccess_list = [[]]",
        f'{{"steps": [{{"worker": {payload}, "subtask": "a", "sees": []}}]}}',
    ]
    for text in texts:
        TRIED["payload"] += 1
        with pytest.raises(WorkflowParseError):
            parse_workflow(text, WORKERS)
        graded = grade(text, "7")
        assert graded.correct is False
        assert is_equivalent(payload, payload.replace("touch", "tou ch"), timeout_s=GRADER_TIMEOUT_S) in (True, False)
    assert not MARKER.exists()
