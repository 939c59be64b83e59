"""The vote seat that stops early (`stop_when_first_agree`), on real recordings: replay-mixed6-cascade
against replay-mixed6-vote (the same six workers; the vote without the rule), with a real warehouse.

test/geometry/685.json (gold 17700): gpt-4o 17800, claude 17700, gemini "17,800", llama-405b 17700,
deepseek 17700, llama-8b "17,700". test/geometry/189.json (gold 9): claude "9" and llama-405b
"\\frac{9}{1}" agree; gpt-4o, gemini, deepseek and llama-8b each give another answer.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from conductor_pipeline.corpora.loaders import load_math_full
from conductor_pipeline.evaluation.frames import fan_out_by_arm
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import WorkerSeat, load_pool
from conductor_pipeline.warehouse import Warehouse
from tests.builders import lists, orchestrate, run_workflow_texts
from tests.shared_data import require_shared_data

SPLIT_VOTE, TIED_VOTE = "test/geometry/685.json", "test/geometry/189.json"
# Pool order in both files: gpt-4o 0, claude 1, gemini 2, llama-405b 3, deepseek 4, llama-8b 5, vote 6.
GPT4O, CLAUDE, GEMINI, LLAMA405, DEEPSEEK, LLAMA8, VOTE = range(7)
FIVE_STEPS = ["Solve it."] * 4 + ["Majority."]


def fan_out(*workers: int) -> str:
    return lists([*workers, VOTE], ["Solve it."] * len(workers) + ["Majority."], [[]] * len(workers) + ["all"])


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        require_shared_data(monkeypatch, tmp_path_factory.mktemp("cache"), "zeroeval_outputs", "math_full")
        cascade, vote = load_pool("replay-mixed6-cascade"), load_pool("replay-mixed6-vote")
        questions = {q.question_id: q for q in load_math_full() if q.question_id in (SPLIT_VOTE, TIED_VOTE)}
        yield {"cascade": (cascade, build_workers(cascade)), "vote": (vote, build_workers(vote))}, questions


def run(pool_and_workers, question, texts: dict[str, str], warehouse=None, run_id: str = "agree") -> dict:
    pool, workers = pool_and_workers
    return run_workflow_texts(pool, workers, question, texts, warehouse=warehouse, run_id=run_id)


def test_two_agreeing_first_answers_skip_the_rest_and_only_their_calls_are_paid(pools, tmp_path: Path) -> None:
    by_pool, questions = pools
    warehouse = Warehouse(tmp_path / "w.duckdb")
    question = questions[SPLIT_VOTE]
    texts = {
        "agree": fan_out(LLAMA405, DEEPSEEK, GPT4O, GEMINI),  # 17700 and 17700
        "agree spelled apart": fan_out(GEMINI, GPT4O, CLAUDE, LLAMA405),  # "17,800" and 17800: one answer
        "disagree": fan_out(GPT4O, CLAUDE, GEMINI, LLAMA405),  # 17800 and 17700
    }
    cascade = run(by_pool["cascade"], question, texts, warehouse)
    vote = run(by_pool["vote"], question, texts)

    agree = cascade["agree"]
    assert agree.workers == ["llama-3.1-405b", "deepseek-v2.5", "majority-vote"] and agree.n_steps == 3
    assert (agree.final_answer, agree.correct) == ("17700", True)
    assert vote["agree"].n_steps == 5 and vote["agree"].correct
    solo_cost = vote["agree"].cost_usd
    assert 0 < agree.cost_usd < solo_cost
    assert cascade["agree spelled apart"].n_steps == 3 and cascade["agree spelled apart"].correct is False
    # Disagreement: every worker runs, and the vote is the plain vote's (two against two, the tie to
    # gpt-4o's group, which is first).
    disagree = cascade["disagree"]
    assert disagree.n_steps == 5 and disagree.cost_usd == pytest.approx(vote["disagree"].cost_usd)
    assert (disagree.final_answer, disagree.correct) == ("17800", False)

    # The skipped steps leave no call rows; the vote's row keeps its place in the written workflow
    # and the number of steps it saw.
    rows = warehouse.query(
        "select step, worker, visible_steps from calls where workflow_id = ? order by step", [agree.workflow_id]
    ).rows()
    assert rows == [(0, "llama-3.1-405b", 0), (1, "deepseek-v2.5", 0), (4, "majority-vote", 2)]


def test_with_four_workers_stopping_early_never_changes_the_votes_answer(pools) -> None:
    """Two agreeing answers first can at most tie with the other two, and a tie goes to the earliest
    group: the reward a fan-out of four earns is the same with the rule, and only the cost differs."""
    by_pool, questions = pools
    orders = list(itertools.permutations(range(6), 4))
    random.Random(0).shuffle(orders)
    texts = {str(order): fan_out(*order) for order in orders[:40]}
    for question_id in (SPLIT_VOTE, TIED_VOTE):
        cascade = run(by_pool["cascade"], questions[question_id], texts)
        vote = run(by_pool["vote"], questions[question_id], texts)
        for name in texts:
            assert (cascade[name].final_answer, cascade[name].correct) == (vote[name].final_answer, vote[name].correct)
            assert cascade[name].cost_usd <= vote[name].cost_usd + 1e-12
        assert any(cascade[name].n_steps == 3 for name in texts)


def test_the_fixed_fan_out_benchmark_replays_what_the_seat_does(pools) -> None:
    """`benchmarks.fixed_fan_outs` scores fan-outs from recorded answers instead of running them: on
    both questions and 40 orders of three or four solvers, its replay gives the seat's verdict, cost
    and number of solver calls."""
    from benchmarks.fixed_fan_outs import replay_fan_out
    from conductor_pipeline.grading import is_equivalent

    by_pool, questions = pools
    pool, _ = by_pool["cascade"]
    names = [seat.name for seat in pool.workers]
    orders = [o for k in (3, 4) for o in itertools.permutations(range(6), k)]
    random.Random(1).shuffle(orders)
    for question_id in (SPLIT_VOTE, TIED_VOTE):
        alone = run(by_pool["cascade"], questions[question_id], {names[w]: lists([w], ["Solve it."], [[]]) for w in range(6)})
        answers = {name: (record.final_answer, record.correct, record.cost_usd) for name, record in alone.items()}
        ran = run(by_pool["cascade"], questions[question_id], {str(order): fan_out(*order) for order in orders[:40]})
        for order in orders[:40]:
            replayed = replay_fan_out([names[w] for w in order], 2, answers, is_equivalent)
            record = ran[str(order)]
            assert (replayed.correct, replayed.calls) == (record.correct, record.n_steps - 1), order
            assert replayed.cost_usd == pytest.approx(record.cost_usd)


def test_the_benchmarks_frontier_keeps_only_what_no_cheaper_fan_out_matches() -> None:
    from benchmarks.fixed_fan_outs import frontier

    rows = [(0.6, 3.0, ("a",)), (0.5, 1.0, ("b",)), (0.5, 2.0, ("c",)), (0.7, 5.0, ("d",)), (0.55, 4.0, ("e",))]
    assert [order for _, _, order in frontier(rows)] == [("b",), ("a",), ("d",)]


def test_the_training_reward_scores_the_stopped_workflow(pools) -> None:
    by_pool, questions = pools
    pool, workers = by_pool["cascade"]

    async def score(text: str):
        return await orchestrate(pool, workers).score_completion(questions[TIED_VOTE], text)

    # claude "9" and llama-405b "\\frac{9}{1}" agree first: right, without asking the others.
    assert asyncio.run(score(fan_out(CLAUDE, LLAMA405, GPT4O, GEMINI))).correct is True
    # Four different answers: the vote's tie goes to gpt-4o, which is wrong.
    assert asyncio.run(score(fan_out(GPT4O, GEMINI, DEEPSEEK, CLAUDE))).correct is False


def test_a_vote_over_only_two_steps_has_nothing_to_skip(pools) -> None:
    by_pool, questions = pools
    record = run(by_pool["cascade"], questions[SPLIT_VOTE], {
        "two": lists([LLAMA405, DEEPSEEK, VOTE], ["Solve it.", "Solve it.", "Majority."], [[], [], "all"]),
    })["two"]
    assert record.n_steps == 3 and record.correct


def test_only_a_vote_seat_has_a_stopping_rule() -> None:
    with pytest.raises(ValidationError, match="stop_when_first_agree"):
        WorkerSeat(name="w", backend="replay", replay_source="zeroeval", model="m", description="d",
                   stop_when_first_agree=2)
    with pytest.raises(ValidationError):
        WorkerSeat(name="v", backend="vote", model="v", description="d", stop_when_first_agree=1)


def test_the_warehouse_says_how_each_arm_spent(pools, tmp_path: Path) -> None:
    """`sql/workflow_fan_out.sql` and `fan_out_by_arm`, the eval's `fan_out` table: stopped early
    (right and wrong) and more than one model call, per arm, from the rows the orchestrator wrote."""
    by_pool, questions = pools
    warehouse = Warehouse(tmp_path / "w.duckdb")
    warehouse.insert("questions", list(questions.values()))
    texts = {"cascade": fan_out(LLAMA405, DEEPSEEK, GPT4O, GEMINI), "solo": lists([GPT4O], ["Solve it."], [[]])}
    for question in questions.values():
        run(by_pool["cascade"], question, texts, warehouse, run_id="spend")
    flags = warehouse.query_file("workflow_fan_out", {"run_id": "spend", "aggregators": ["majority-vote"]})
    spent = {row["arm"]: row for row in fan_out_by_arm(flags).iter_rows(named=True)}
    # 685: llama-405b and deepseek agree on 17700 (right) and stop; 189: llama-405b "\\frac{9}{1}" and
    # deepseek disagree, all four run and the four-way tie goes to llama-405b (right).
    assert spent["cascade"] == {
        "arm": "cascade", "workflows": 2, "fan_out": 2, "share": 1.0, "more_than_one_call": 1.0,
        "stopped_early": 1, "stopped_right": 1, "stopped_wrong": 0,
    }
    assert (spent["solo"]["fan_out"], spent["solo"]["more_than_one_call"], spent["solo"]["stopped_early"]) == (0, 0.0, 0)
