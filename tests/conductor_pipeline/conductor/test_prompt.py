"""The conductor prompt: catalogue naming, examples that parse, predictions, the recursion variant."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from conductor_pipeline.conductor.prompt import (
    CatalogueEntry,
    PromptExample,
    build_conductor_prompt,
    build_recursion_prompt,
    default_examples,
    displayed_worker_names,
    load_prompt_examples,
)
from conductor_pipeline.records import Question
from conductor_pipeline.workflow import Step, Workflow, parse_workflow, render_workflow

CATALOGUE = [
    CatalogueEntry("q4", "Qwen3-4B: fast, solid on arithmetic"),
    CatalogueEntry("q9", "Qwen3.5-9B: a reasoning model, slower"),
    ("llama8", "Llama-3.1-8B: a generalist"),  # plain pairs are accepted too
]


def test_ordinal_naming_hides_real_names_and_the_parser_gets_the_displayed_ones():
    system, user = build_conductor_prompt("How many primes are below 20?", CATALOGUE)
    assert system["role"] == "system" and user["role"] == "user"
    assert "- Model 0: Qwen3-4B: fast, solid on arithmetic" in system["content"]
    assert "- Model 2: Llama-3.1-8B: a generalist" in system["content"]
    assert "q9" not in system["content"] and "llama8" not in system["content"]
    assert "How many primes are below 20?" in user["content"]
    displayed = displayed_worker_names(CATALOGUE, "ordinal")
    assert displayed == ["Model 0", "Model 1", "Model 2"]
    assert parse_workflow("model_id = [2]\nsubtasks = ['Count them']\naccess_list = [[]]", displayed).workers == (
        "Model 2",
    )


def test_real_names_when_asked():
    system, _ = build_conductor_prompt("Q", CATALOGUE, naming="names")
    assert "- q4: Qwen3-4B" in system["content"] and "Model 0" not in system["content"]
    assert displayed_worker_names(CATALOGUE, "names") == ["q4", "q9", "llama8"]


@pytest.mark.parametrize("naming", ["ordinal", "names"])
def test_every_example_shown_in_the_prompt_parses_against_the_displayed_names(naming):
    examples = default_examples(6)
    system = build_conductor_prompt("Q", CATALOGUE, naming=naming, examples=examples)[0]["content"]
    displayed = displayed_worker_names(CATALOGUE, naming)
    for example in examples:
        workflow = example.workflow(displayed)
        shown = render_workflow(workflow, displayed, by_index=naming == "ordinal")
        assert shown in system
        assert parse_workflow(f"{example.reasoning}\n{shown}", displayed) == workflow


def test_default_examples_are_four_and_come_from_other_tasks():
    examples = default_examples()
    assert len(examples) == 4
    assert len(load_prompt_examples()) >= 6
    assert not any("math" in example.task for example in load_prompt_examples())
    with pytest.raises(ValueError):
        default_examples(99)


def test_example_workers_wrap_around_a_small_catalogue():
    three_step = next(e for e in load_prompt_examples() if len(e.steps) == 3)
    assert three_step.workflow(["A", "B"]).workers == tuple("AB"[s.worker % 2] for s in three_step.steps)


def test_an_example_that_sees_a_later_step_is_rejected():
    with pytest.raises(ValidationError):
        PromptExample(task="t", question="q", steps=[{"worker": 0, "subtask": "s", "sees": [0]}])


def test_predicted_success_is_shown_only_where_known():
    system = build_conductor_prompt("Q", CATALOGUE, predicted_success={"q9": 0.8125})[0]["content"]
    line_q9 = next(line for line in system.splitlines() if line.startswith("- Model 1"))
    line_q4 = next(line for line in system.splitlines() if line.startswith("- Model 0"))
    assert "81%" in line_q9 and "predicted" not in line_q4


def test_a_question_record_is_accepted():
    question = Question("test/algebra/1.json", "math", "test", "Solve x + 1 = 3.", "2")
    assert "Solve x + 1 = 3." in build_conductor_prompt(question, CATALOGUE)[1]["content"]


def test_max_steps_and_worker_range_are_stated():
    system = build_conductor_prompt("Q", CATALOGUE, max_steps=3)[0]["content"]
    assert "1 to 3 steps" in system and "worker numbers 0 to 2" in system


def test_recursion_prompt_shows_parent_and_answer_and_offers_the_pass_through():
    parent = Workflow((Step("Model 1", "Solve it. Give the final answer in \\boxed{}.", ()),))
    system, user = build_recursion_prompt("What is 6 * 7?", CATALOGUE, parent, "The answer is \\boxed{42}.")
    assert render_workflow(parent, displayed_worker_names(CATALOGUE, "ordinal"), by_index=True) in user["content"]
    assert "\\boxed{42}" in user["content"] and "What is 6 * 7?" in user["content"]
    assert "model_id = []\nsubtasks = []\naccess_list = []" in system["content"]
    assert parse_workflow(
        "It is right.\nmodel_id = []\nsubtasks = []\naccess_list = []", ["Model 0"], allow_empty=True
    ) == Workflow(())


def test_recursion_prompt_takes_text_and_says_when_there_is_no_answer():
    _, user = build_recursion_prompt("Q", CATALOGUE, "model_id = [0]\nsubtasks = ['x']\naccess_list = [[]]", None)
    assert "subtasks = ['x']" in user["content"] and "no answer" in user["content"]


def test_a_ranked_catalogue_lists_workers_by_predicted_success_keeping_the_given_order_for_ties():
    from conductor_pipeline.conductor.prompt import rank_by_predicted_success

    names = ["c", "a", "b", "d"]
    assert rank_by_predicted_success(names, {"a": 0.2, "b": 0.9, "c": 0.2, "d": 0.5}) == ["b", "d", "c", "a"]
    # A worker W has no number for goes last; the input is not changed.
    assert rank_by_predicted_success(names, {"a": 0.1, "b": 0.3}) == ["b", "a", "c", "d"]
    assert names == ["c", "a", "b", "d"]


def test_a_ranked_catalogue_needs_the_numbers_it_is_ranked_by():
    from conductor_pipeline.conductor.prompt import PromptSpec

    assert PromptSpec(show_predicted_success=True, ranked_catalogue=True).ranked_catalogue
    with pytest.raises(ValidationError, match="needs show_predicted_success"):
        PromptSpec(ranked_catalogue=True)
