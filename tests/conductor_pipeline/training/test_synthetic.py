"""Synthetic warm-start pairs: every target is a valid workflow over the pool's displayed workers."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from conductor_pipeline.conductor.prompt import CatalogueEntry, displayed_worker_names
from conductor_pipeline.pools.backends.vote import MIN_VOTE_INPUTS
from conductor_pipeline.pools.config import PoolConfig, load_pool
from conductor_pipeline.records import Question
from conductor_pipeline.training.rollouts import pool_prompt_rows
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.training.synthetic import (
    COMPACT_SUBTASKS,
    STYLES,
    format_corpus,
    synthetic_target,
    synthetic_workflows,
    warm_start_pairs,
)
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


# --- pools with an aggregator or the conductor itself ----------------------------------------------


def _rows(pool_name: str, n: int, seed: int = 0) -> tuple[PoolConfig, list[dict]]:
    """The pool's GRPO prompt rows (randomised sub-pools, no anchors) for `n` made-up questions."""
    pool = load_pool(pool_name)
    questions = [
        Question(question_id=f"q{i}", corpus="gsm8k", split="test", problem=f"What is {i} + {i}?", answer=str(2 * i))
        for i in range(n)
    ]
    return pool, pool_prompt_rows(questions, pool, GRPOSettings.cpu_profile(seed=seed), naming="ordinal", n_examples=0)


@pytest.mark.parametrize("pool_name", ["replay-mixed6-vote", "replay-mixed6-recursive"])
def test_random_sub_pools_sometimes_show_a_seat_that_cannot_answer_alone_but_never_only_such_seats(pool_name):
    pool, rows = _rows(pool_name, 200)
    [special] = [seat.name for seat in pool.workers if not seat.answers_alone]
    showing = [row for row in rows if special in row["workers"]]
    assert 0.2 * len(rows) < len(showing) < 0.9 * len(rows)  # in some sub-pools and not in others
    assert all(set(row["workers"]) & set(pool.solo_worker_names) for row in rows)
    assert {len(row["workers"]) for row in showing} >= {2, 7}


@pytest.mark.parametrize("style", ["compact", "paper"])
def test_prompts_showing_the_vote_get_fan_out_targets_and_never_a_vote_alone(style):
    _, rows = _rows("replay-mixed6-vote", 300)
    shown = {row["prompt"][-1]["content"]: row["workers"] for row in rows}  # each prompt asks its own question
    fan_outs = with_vote = 0
    for messages, target in warm_start_pairs(rows, n=600, seed=1, style=style, aggregators=["majority-vote"]):
        workers = shown[messages[-1]["content"]]
        can_fan_out = "majority-vote" in workers and len(workers) - 1 >= MIN_VOTE_INPUTS
        with_vote += can_fan_out
        workflow = parse_workflow(target, displayed_worker_names(workers, "ordinal"))
        used = [workers[int(name.split()[-1])] for name in workflow.workers]  # "Model k" is the k-th shown
        if "majority-vote" not in used:
            continue
        assert can_fan_out
        fan_outs += 1
        # The vote is the last step, sees every earlier step, and those are three or more distinct solvers.
        assert used[-1] == "majority-vote" and used.count("majority-vote") == 1
        assert workflow.steps[-1].sees == tuple(range(len(used) - 1))
        assert len(set(used[:-1])) == len(used) - 1 >= MIN_VOTE_INPUTS
    assert 0.2 < fan_outs / with_vote < 0.4  # FAN_OUT_SHARE of the prompts that show the vote and enough solvers


@pytest.mark.parametrize("style", ["compact", "paper"])
def test_fan_out_only_makes_every_multi_step_target_a_fan_out(style):
    """With `fan_out_only`, a prompt that shows the vote gets single steps at the style's single-step
    weight and fan-outs for the rest: no chain and no judge that is not the vote; workers stay uniform."""
    _, rows = _rows("replay-mixed6-vote", 300)
    shown = {row["prompt"][-1]["content"]: row["workers"] for row in rows}
    single_weight = sum(s.weight for s in STYLES[style] if len(s.subtasks) == 1) / sum(s.weight for s in STYLES[style])
    singles = with_vote = 0
    first_solvers: Counter[str] = Counter()
    pairs = warm_start_pairs(rows, n=1200, seed=1, style=style, aggregators=["majority-vote"], fan_out_only=True)
    for messages, target in pairs:
        workers = shown[messages[-1]["content"]]
        used = [workers[int(name.split()[-1])] for name in parse_workflow(
            target, displayed_worker_names(workers, "ordinal")).workers]
        if "majority-vote" not in workers or len(workers) - 1 < MIN_VOTE_INPUTS:  # too few solvers to fan out
            continue
        with_vote += 1
        singles += len(used) == 1
        first_solvers[used[0]] += 1
        assert len(used) == 1 or (used[-1] == "majority-vote" and len(set(used[:-1])) == len(used) - 1 >= 3)
    assert with_vote > 500
    assert abs(singles / with_vote - single_weight) < 0.06
    assert "majority-vote" not in first_solvers and len(first_solvers) == 6
    # Off, the same rows keep today's mix, chains included.
    chains = 0
    for messages, target in warm_start_pairs(rows, n=1200, seed=1, style=style, aggregators=["majority-vote"]):
        workers = shown[messages[-1]["content"]]
        used = [workers[int(name.split()[-1])] for name in parse_workflow(
            target, displayed_worker_names(workers, "ordinal")).workers]
        chains += len(used) > 1 and "majority-vote" not in used
    assert chains > 100


def test_max_fan_out_widens_fan_outs_up_to_the_step_limit():
    """Fan-outs draw three (MIN_VOTE_INPUTS) to `max_fan_out` solvers (the style's MAX_FAN_OUT by
    default); four solvers and the vote are the five-step limit, so five is refused, and so is two."""
    displayed = displayed_worker_names([f"w{i}" for i in range(7)], "ordinal")

    def widths(**kwargs) -> set[int]:
        rng = random.Random(0)
        targets = [synthetic_target(rng, displayed, naming="ordinal", style="compact", aggregators=[displayed[6]],
                                    fan_out_only=True, **kwargs) for _ in range(400)]
        return {len(parse_workflow(t, displayed).steps) - 1 for t in targets} - {0}

    assert widths() == {3}
    assert widths(max_fan_out=4) == {3, 4}
    for refused in (2, 5):
        with pytest.raises(ValueError, match="max_fan_out must be 3 to 4"):
            widths(max_fan_out=refused)


def test_without_an_aggregator_targets_are_what_they_were():
    """Naming no aggregator draws exactly the single-worker shapes (the default pool's warm start)."""
    rows = _rows("replay-mixed6", 20)[1]
    assert warm_start_pairs(rows, n=50, seed=2, style="compact") == warm_start_pairs(
        rows, n=50, seed=2, style="compact", aggregators=["not-in-these-prompts"]
    )
    with pytest.raises(ValueError, match="answers alone"):
        synthetic_target(random.Random(0), ["Model 0"], naming="ordinal", style="compact", aggregators=["Model 0"])


def test_named_targets_say_whom_they_pick_by_catalogue_label_then_by_number():
    """The "named" style: a line per chosen worker, its catalogue label then its displayed name,
    and the lists that run it; the workers are drawn as uniformly as the compact style's."""
    import re

    from conductor_pipeline.conductor.prompt import catalogue_from_pool, worker_label

    pool = load_pool("replay-mixed6")
    labels = {entry.name: worker_label(entry) for entry in catalogue_from_pool(pool)}
    assert labels["gpt-4o"] == "OpenAI GPT-4o" and labels["llama-3.1-8b"] == "Meta Llama 3.1 8B"
    assert labels["llama-3.1-405b"] == "Meta Llama 3.1 405B"  # the two Llamas are told apart
    rows = pool_prompt_rows(
        [Question(f"q{i}", "math", "test", QUESTIONS[i % 3], "5") for i in range(30)], pool,
        GRPOSettings.cpu_profile(), naming="ordinal", n_examples=0,
    )
    positions = []
    for prompt, target in warm_start_pairs(rows, n=300, seed=0, naming="ordinal", style="named", labels=labels):
        row = next(r for r in rows if r["prompt"] == prompt)
        displayed = displayed_worker_names(row["workers"], "ordinal")
        workflow = parse_workflow(target, displayed)
        named = re.findall(r"^(.+) = (Model \d+)$", target, flags=re.MULTILINE)
        assert [d for _, d in named] == list(dict.fromkeys(step.worker for step in workflow.steps))
        for label, shown in named:
            assert labels[row["workers"][displayed.index(shown)]] == label
        positions += [displayed.index(step.worker) / len(displayed) for step in workflow.steps]
    assert 0.35 < sum(positions) / len(positions) < 0.5  # no lean to low numbers: about the middle of the pool
