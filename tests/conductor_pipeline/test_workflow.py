"""The workflow parser: round trips, failure codes, and that nothing but WorkflowParseError escapes."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor_pipeline.workflow import (
    PARSE_CODES,
    PARSE_OK,
    Step,
    Workflow,
    WorkflowParseError,
    parse_code,
    parse_workflow,
    render_workflow,
)

ORDINAL = [f"Model {i}" for i in range(4)]
WORKFLOW_WORDS = ("model_id", "subtasks", "access_list", '"steps"')


def _free_of_workflow_words(text: str) -> bool:
    return not any(word in text for word in WORKFLOW_WORDS)


@st.composite
def pools_and_workflows(draw: st.DrawFn, max_steps: int = 5) -> tuple[list[str], Workflow]:
    pool = draw(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=6, unique=True))
    n_steps = draw(st.integers(1, max_steps))
    steps = []
    for index in range(n_steps):
        worker = draw(st.sampled_from(pool))
        subtask = draw(st.text(min_size=1, max_size=60).filter(lambda s: s.strip()))
        sees = draw(st.sets(st.integers(0, index - 1), max_size=index)) if index else set()
        steps.append(Step(worker, subtask, tuple(sorted(sees))))
    return pool, Workflow(tuple(steps))


reasoning = st.text(max_size=200).filter(_free_of_workflow_words)
fences = st.sampled_from([("", ""), ("```python\n", "\n```"), ("```json\n", "\n```"), ("```\n", "\n```")])


@settings(max_examples=250, suppress_health_check=[HealthCheck.too_slow])
@given(
    pools_and_workflows(),
    st.sampled_from(["lists", "json"]),
    st.booleans(),
    reasoning,
    fences,
    reasoning,
)
def test_every_rendered_workflow_parses_back_to_itself(pool_and_workflow, form, by_index, before, fence, after):
    pool, workflow = pool_and_workflow
    block = render_workflow(workflow, pool, form=form, by_index=by_index)
    text = f"{before}\n\n{fence[0]}{block}{fence[1]}\n\n{after}"
    assert parse_workflow(text, pool) == workflow


# Pieces that make structure: random sequences of them reach deep into the decoders.
STRUCTURE_PIECES = [
    "[", "]", "{", "}", ",", ":", "=", '"', "'", "\\", " ", "\n", "#", "0", "1", "7", "-", "_", "x",
    "all", '"all"', "model_id", "subtasks", "access_list", '"steps"', '"worker"', '"subtask"', '"sees"',
    "model_id = [", '{"steps": [', '"Model 0"', "true", "None", "\\u12", "\\N{", "```",
]  # fmt: skip


def _assert_parses_or_coded(text: str, pool: list[str]) -> None:
    try:
        result = parse_workflow(text, pool)
    except WorkflowParseError as exc:
        assert exc.code in PARSE_CODES
    else:
        assert isinstance(result, Workflow) and 1 <= len(result.steps) <= 5
        assert all(step.worker in pool for step in result.steps)


@settings(max_examples=300)
@given(st.one_of(st.text(), st.lists(st.sampled_from(STRUCTURE_PIECES), max_size=60).map("".join)))
def test_arbitrary_text_raises_only_workflow_parse_errors(text):
    _assert_parses_or_coded(text, ORDINAL)


@st.composite
def mutated_blocks(draw: st.DrawFn) -> tuple[list[str], str]:
    pool, workflow = draw(pools_and_workflows())
    text = render_workflow(workflow, pool, form=draw(st.sampled_from(["lists", "json"])), by_index=draw(st.booleans()))
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["delete", "insert", "truncate", "duplicate"]))
        if action == "delete":
            text = text[:position] + text[position + 1 :]
        elif action == "insert":
            text = text[:position] + draw(st.sampled_from(STRUCTURE_PIECES)) + text[position:]
        elif action == "truncate":
            text = text[:position]
        else:
            end = draw(st.integers(position, len(text)))
            text = text[:end] + text[position:end] + text[end:]
    return pool, text


@settings(max_examples=300)
@given(mutated_blocks())
def test_mutated_blocks_raise_only_workflow_parse_errors(pool_and_text):
    pool, text = pool_and_text
    _assert_parses_or_coded(text, pool)


FAILURES = [
    ("I would ask Model 1 to solve it.", "no_workflow"),
    ('{"steps": [{"worker": 0, "subtask": "Solve it", "sees": []},]}', "json_decode"),  # trailing comma
    ("{'steps': []}\nmodel_id = [0, 1", "json_decode"),  # unclosed literal
    ("model_id = [0]\nsubtasks = [f'Solve']\naccess_list = [[]]", "json_decode"),  # not a plain literal
    ("model_id = [0]\nsubtasks = ['Solve']", "schema"),  # access_list missing
    ('{"steps": [{"worker": 0, "subtask": "Solve"}]}', "schema"),  # sees missing
    ('{"steps": [{"worker": 0, "subtask": "Solve", "sees": []}], "note": "x"}', "schema"),  # extra key
    ('{"steps": [], "steps": []}', "schema"),  # repeated key
    ("model_id = [0]\nsubtasks = [['Solve']]\naccess_list = [[]]", "schema"),
    ("model_id = [0]\nsubtasks = ['Solve']\naccess_list = [[-1]]", "schema"),
    ("model_id = [0, 1]\nsubtasks = ['Solve']\naccess_list = [[], 'all']", "length_mismatch"),
    ("model_id = []\nsubtasks = []\naccess_list = []", "empty"),
    ('{"steps": []}', "empty"),
    (
        "model_id = [0, 1, 2, 3, 0, 1]\nsubtasks = ['a', 'b', 'c', 'd', 'e', 'f']\naccess_list = [[], [], [], [], [], 'all']",
        "too_many_steps",
    ),
    ("model_id = [4]\nsubtasks = ['Solve']\naccess_list = [[]]", "unknown_worker"),
    ("model_id = ['model 0']\nsubtasks = ['Solve']\naccess_list = [[]]", "unknown_worker"),  # case-sensitive
    ("model_id = [0, 1]\nsubtasks = ['Solve', 'Check']\naccess_list = [[], [1]]", "forward_dep"),
    ("model_id = [0]\nsubtasks = ['  \\n ']\naccess_list = [[]]", "empty_subtask"),
]


@pytest.mark.parametrize(("text", "code"), FAILURES)
def test_each_failure_has_its_code(text, code):
    with pytest.raises(WorkflowParseError) as caught:
        parse_workflow(text, ORDINAL)
    assert caught.value.code == code
    assert parse_code(text, ORDINAL) == code


def test_every_code_has_an_example():
    assert {code for _, code in FAILURES} == set(PARSE_CODES)


def test_paper_form_with_reasoning_trailing_comma_comments_and_python_quotes():
    text = """The question needs algebra. Model 2 is strong; I'll let Model 0 check it.
```python
model_id = [2, "Model 0"]
subtasks = [
    'Solve the problem, it\\'s short; give the answer in \\\\boxed{}',  # the solver
    "Check the previous solution step by step.",
]
access_list = [[], ["all"]]
```
"""
    workflow = parse_workflow(text, ORDINAL)
    assert workflow.workers == ("Model 2", "Model 0")
    assert workflow.steps[0].subtask == "Solve the problem, it's short; give the answer in \\boxed{}"
    assert workflow.steps[1].sees == (0,)


def test_json_three_list_object_and_step_object_agree():
    lists = '{"model_id": [1, 0], "subtasks": ["Solve", "Verify"], "access_list": [[], "all"]}'
    steps = (
        '```json\n{"steps": [{"worker": "Model 1", "subtask": "Solve", "sees": []},'
        ' {"worker": 0, "subtask": "Verify", "sees": [0]}]}\n```'
    )
    assert parse_workflow(lists, ORDINAL) == parse_workflow(steps, ORDINAL)


def test_last_block_wins():
    first = "model_id = [0]\nsubtasks = ['Draft']\naccess_list = [[]]"
    second = '{"steps": [{"worker": 3, "subtask": "Final", "sees": []}]}'
    third = "model_id = [1]\nsubtasks = ['Last']\naccess_list = ['all']"
    assert parse_workflow(f"{first}\nOn reflection:\n{second}", ORDINAL).workers == ("Model 3",)
    assert parse_workflow(f"{second}\nNo:\n{third}", ORDINAL).workers == ("Model 1",)
    # An earlier bad block does not matter; a later bad block does.
    assert parse_code(f"model_id = [9\n{third}", ORDINAL) == "json_decode"  # the unclosed literal runs on
    assert parse_code(f'{{"steps": [}}\n{third}', ORDINAL) == PARSE_OK
    assert parse_code(f"{third}\n{{\"steps\": [1,]}}", ORDINAL) == "json_decode"


def test_later_reassignment_of_one_list_counts():
    text = "model_id = [0]\nsubtasks = ['Solve']\naccess_list = [[]]\nActually: model_id = [3]"
    assert parse_workflow(text, ORDINAL).workers == ("Model 3",)


def test_workflow_words_inside_strings_are_not_blocks():
    workflow = Workflow((Step("Model 0", 'Explain: model_id = [1] and {"steps": [', ()),))
    for form in ("lists", "json"):
        assert parse_workflow(render_workflow(workflow, ORDINAL, form=form), ORDINAL) == workflow


def test_access_entries_all_and_index_lists():
    text = "model_id = [0, 1, 2]\nsubtasks = ['a', 'b', 'c']\naccess_list = ['all', [0, 0], ['all']]"
    assert [step.sees for step in parse_workflow(text, ORDINAL).steps] == [(), (0,), (0, 1)]


def test_empty_lists_only_in_recursion_mode():
    text = "The answer so far is right.\nmodel_id = []\nsubtasks = []\naccess_list = []"
    assert parse_workflow(text, ORDINAL, allow_empty=True) == Workflow(())
    assert parse_code(text, ORDINAL) == "empty"
    assert render_workflow(Workflow(()), ORDINAL) == "model_id = []\nsubtasks = []\naccess_list = []"


def test_max_steps_is_configurable():
    text = "model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = [[], 'all']"
    assert parse_code(text, ORDINAL, max_steps=1) == "too_many_steps"


def test_error_pickles_with_its_code():
    error = pickle.loads(pickle.dumps(WorkflowParseError("schema", "bad shape")))
    assert error.code == "schema" and "bad shape" in str(error)


@pytest.mark.parametrize(
    "text",
    [
        '{"steps": [' * 50_000,
        "model_id = [" * 50_000,
        "model_id = " + "[" * 50_000 + "]" * 50_000 + "\nsubtasks = []\naccess_list = []",
        '"' * 50_000 + "'" * 50_000,
        '{"steps": "' + "\\" * 100_001,
        "model_id = [" + "9" * 10_000 + "]\nsubtasks = ['a']\naccess_list = [[]]",
    ],
)
def test_pathological_inputs_fail_cleanly(text):
    assert parse_code(text, ORDINAL) in PARSE_CODES


def test_render_rejects_workers_outside_the_pool():
    with pytest.raises(ValueError):
        render_workflow(Workflow((Step("gpt", "Solve", ()),)), ORDINAL)


@settings(max_examples=300)
@given(
    st.lists(st.text(min_size=1).filter(lambda s: s.strip()), min_size=1, max_size=3),
    st.sampled_from(["repr", "json_ascii", "json_unicode"]),
)
def test_list_literals_read_as_python_reads_them(subtasks, spelling):
    """The no-eval decoder agrees with Python's own reading (checked here, on generated data only)."""
    import ast
    import json

    literal = {
        "repr": repr,
        "json_ascii": lambda v: json.dumps(v, ensure_ascii=True),
        "json_unicode": lambda v: json.dumps(v, ensure_ascii=False),
    }[spelling](subtasks)
    n = len(subtasks)
    text = f"model_id = {[0] * n}\nsubtasks = {literal}\naccess_list = {[[]] * n}"
    parsed = parse_workflow(text, ORDINAL)
    assert [step.subtask for step in parsed.steps] == ast.literal_eval(literal)


def test_python_only_escapes():
    text = "model_id = [0]\nsubtasks = ['a\\/b \\x41 \\101 \\N{BULLET} \\d \"q\"']\naccess_list = [[]]"
    assert parse_workflow(text, ORDINAL).steps[0].subtask == 'a\\/b A A \u2022 \\d "q"'
    surrogates = 'model_id = [0]\nsubtasks = ["\\ud83d\\ude00"]\naccess_list = [[]]'
    assert parse_workflow(surrogates, ORDINAL).steps[0].subtask == "\ud83d\ude00"  # two code points, as Python reads it
