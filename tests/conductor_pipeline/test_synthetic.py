"""Synthetic warm-start pairs: every target is a valid workflow over the pool's displayed workers."""

from __future__ import annotations

import pytest

from conductor_pipeline.prompt import CatalogueEntry, displayed_worker_names
from conductor_pipeline.synthetic import synthetic_workflows
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
