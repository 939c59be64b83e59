"""Synthetic warm-start pairs: every target is a valid workflow over the pool's displayed workers."""

from __future__ import annotations

import pytest

from conductor_pipeline.conductor.prompt import CatalogueEntry, displayed_worker_names
from conductor_pipeline.training.synthetic import COMPACT_SUBTASKS, format_corpus, synthetic_workflows, warm_start_pairs
from conductor_pipeline.workflow import parse_workflow

QUESTIONS = ["What is 2 + 3?", "A train travels 60 km in 1.5 hours. What is its speed?", "Solve x^2 = 9."]


@pytest.mark.parametrize("naming", ["ordinal", "names"])
@pytest.mark.parametrize("workers", [["q4"], ["q4", "q9"], ["q4", "q9", "llama8", "phi"]])
def test_every_synthetic_target_parses(naming, workers):
    pairs = synthetic_workflows(QUESTIONS, workers, n=200, seed=3, naming=naming)
    assert len(pairs) == 200
    displayed = displayed_worker_names(workers, naming)
    lengths = set()
    for messages, target in pairs:
        workflow = parse_workflow(target, displayed)
        lengths.add(len(workflow.steps))
        assert set(workflow.workers) <= set(displayed)
        assert "\\boxed{}" in workflow.steps[-1].subtask
        assert [m["role"] for m in messages] == ["system", "user"]
        assert any(q in messages[1]["content"] for q in QUESTIONS)
    assert lengths == {1, 2, 3}


def test_deterministic_in_the_seed():
    entries = [CatalogueEntry("q4", "small"), CatalogueEntry("q9", "large")]
    assert synthetic_workflows(QUESTIONS, entries, n=20, seed=1) == synthetic_workflows(QUESTIONS, entries, n=20, seed=1)
    assert synthetic_workflows(QUESTIONS, entries, n=20, seed=1) != synthetic_workflows(QUESTIONS, entries, n=20, seed=2)


def test_multi_step_workflows_use_distinct_workers_when_the_pool_allows():
    workers = ["a", "b", "c"]
    for _, target in synthetic_workflows(QUESTIONS, workers, n=100, seed=0, naming="names"):
        used = parse_workflow(target, workers).workers
        assert len(set(used)) == len(used)


def test_needs_questions_and_workers():
    with pytest.raises(ValueError):
        synthetic_workflows([], ["a"], n=1, seed=0)
    with pytest.raises(ValueError):
        synthetic_workflows(QUESTIONS, [], n=1, seed=0)


@pytest.mark.parametrize("workers", [["q4", "q9"], ["q4", "q9", "llama8", "phi", "mistral", "gemma"]])
def test_compact_targets_are_only_the_lists_from_a_fixed_phrase_set(workers):
    pairs = synthetic_workflows(QUESTIONS, workers, n=200, seed=5, style="compact")
    displayed = displayed_worker_names(workers, "ordinal")
    lengths = set()
    for _, target in pairs:
        assert target.startswith("model_id = [")  # no reasoning line: nothing to sample but the workflow
        workflow = parse_workflow(target, displayed)
        lengths.add(len(workflow.steps))
        assert {step.subtask for step in workflow.steps} <= set(COMPACT_SUBTASKS)
        assert "\\boxed{}" in workflow.steps[-1].subtask
    assert lengths == {1, 2, 3}


def test_warm_start_pairs_use_the_grpo_prompts_and_their_sub_pools():
    rows = [
        {"prompt": [{"role": "system", "content": f"catalogue {i}"}, {"role": "user", "content": q}], "workers": workers}
        for i, (q, workers) in enumerate(zip(QUESTIONS, [["a", "b"], ["a", "b", "c", "d"], ["c", "d", "e"]], strict=True))
    ]
    pairs = warm_start_pairs(rows, n=30, seed=2, style="compact")
    assert len(pairs) == 30
    by_prompt = {row["prompt"][0]["content"]: row for row in rows}
    for messages, target in pairs:
        row = by_prompt[messages[0]["content"]]
        assert messages == row["prompt"]
        parse_workflow(target, displayed_worker_names(row["workers"], "ordinal"))  # indices within that sub-pool
    # Every row is used before any repeats (10 full passes over 3 rows).
    assert {m[0]["content"] for m, _ in pairs[:3]} == set(by_prompt)
    assert warm_start_pairs(rows, n=30, seed=2, style="compact") == pairs


def test_format_corpus_renders_both_styles():
    texts = format_corpus(20, seed=0)
    assert len(texts) == 20
    assert any(t.startswith("model_id") for t in texts) and any(not t.startswith("model_id") for t in texts)
