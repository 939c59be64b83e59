"""The vote seat on real recordings (replay-mixed6-vote), through every orchestrator path: recorded
workflows, recursion, training rollouts and evaluation arms, with a real DuckDB warehouse.

Two MATH level-5 questions whose recorded answers disagree:
- test/geometry/685.json (gold 17700): gpt-4o 17800, claude 17700, gemini "17,800", llama-405b
  17700, deepseek 17700, llama-8b "17,700".
- test/geometry/189.json (gold 9): claude "9" and llama-405b "\\frac{9}{1}" agree; gpt-4o, gemini,
  deepseek and llama-8b each give another answer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import polars as pl
import pytest

from conductor_pipeline.corpora.loaders import load_math_full
from conductor_pipeline.evaluation.arms import ConductorArm
from conductor_pipeline.evaluation.lineup import eval_lineup, run_lineup
from conductor_pipeline.evaluation.routers import BestSingleChoice
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat, load_pool
from conductor_pipeline.records import CallStatus, Question
from conductor_pipeline.training.rollouts import PoolExecutor
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.data import load_training_frame
from tests.builders import ScriptedPolicy, lists, orchestrate, run_workflow_texts
from tests.shared_data import require_shared_data

POOL = "replay-mixed6-vote"
SPLIT_VOTE, TIED_VOTE = "test/geometry/685.json", "test/geometry/189.json"
# Pool order: gpt-4o 0, claude 1, gemini 2, llama-405b 3, deepseek 4, llama-8b 5, majority-vote 6.
VOTE = 6
FIVE_STEPS = ["Solve it."] * 4 + ["Majority."]
# A workflow has at most five steps: four workers, then the vote that sees them all.
FAN_OUT = lists([1, 0, 2, 3, VOTE], FIVE_STEPS, [[], [], [], [], "all"])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[PoolConfig, dict, dict[str, Question]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        require_shared_data(monkeypatch, tmp_path_factory.mktemp("cache"), "zeroeval_outputs", "math_full")
        pool = load_pool(POOL)
        workers = build_workers(pool)
        questions = {q.question_id: q for q in load_math_full() if q.question_id in (SPLIT_VOTE, TIED_VOTE)}
    return pool, workers, questions


def run_texts(pool, workers, warehouse, question, texts: dict[str, str]) -> dict:
    return run_workflow_texts(pool, workers, question, texts, warehouse=warehouse, run_id="vote")


def test_the_vote_answers_the_majority_of_what_its_access_list_shows(recorded, tmp_path: Path) -> None:
    pool, workers, questions = recorded
    warehouse = Warehouse(tmp_path / "w.duckdb")
    warehouse.insert("questions", list(questions.values()))
    records = run_texts(pool, workers, warehouse, questions[SPLIT_VOTE], {
        # claude 17700, gpt-4o 17800, gemini "17,800", llama-405b 17700: two against two, and the
        # tie goes to the group of the earliest step, so the order the conductor wrote decides.
        "claude first": FAN_OUT,
        "gpt-4o first": lists([0, 1, 2, 3, VOTE], FIVE_STEPS, [[], [], [], [], "all"]),
        # Shown only gpt-4o and gemini (17800 spelled two ways), not the other two.
        "sees 1 and 2": lists([1, 0, 2, 3, VOTE], FIVE_STEPS, [[], [], [], [], [1, 2]]),
        "sees nothing": lists([0, VOTE], ["Solve it.", "Majority."], [[], []]),
    })
    assert (records["claude first"].final_answer, records["claude first"].correct) == ("17700", True)
    assert (records["gpt-4o first"].final_answer, records["gpt-4o first"].correct) == ("17800", False)
    assert (records["sees 1 and 2"].final_answer, records["sees 1 and 2"].correct) == ("17800", False)
    nothing = records["sees nothing"]
    assert nothing.final_answer is None and nothing.correct is False and not nothing.infra_failure
    # The fan-out costs the four workers' (estimated) calls; the vote itself costs nothing.
    assert records["claude first"].cost_usd > 0

    calls = warehouse.query(
        "SELECT worker, step, status, correct, cost_usd, visible_steps, error FROM calls "
        "WHERE kind = 'step' AND worker = 'majority-vote' ORDER BY visible_steps"
    )
    assert calls["visible_steps"].to_list() == [0, 2, 4, 4]
    assert calls["status"].to_list() == [CallStatus.EMPTY, CallStatus.OK, CallStatus.OK, CallStatus.OK]
    assert sorted(calls["correct"].to_list()[2:]) == [False, True] and calls["cost_usd"].to_list() == [0.0] * 4
    assert "access list is empty" in calls["error"][0]
    solo_steps = warehouse.query("SELECT DISTINCT visible_steps FROM calls WHERE worker <> 'majority-vote'")
    assert solo_steps["visible_steps"].to_list() == [0]
    # The world model's training rows carry the topology of each step.
    frame = load_training_frame(warehouse).filter(pl.col("worker") == "majority-vote")
    assert sorted(frame["visible_steps"].to_list()) == [0, 2, 4, 4]


def test_equivalent_spellings_outvote_the_strongest_single_worker(recorded, tmp_path: Path) -> None:
    pool, workers, questions = recorded
    records = run_texts(pool, workers, None, questions[TIED_VOTE], {
        "solo": lists([0], ["Solve it."], [[]]),
        # claude "9" and llama-405b "\frac{9}{1}" are one answer, against gpt-4o's and gemini's.
        "fan-out": lists([0, 1, 2, 3, VOTE], FIVE_STEPS, [[], [], [], [], "all"]),
        # A one-one tie between gpt-4o and claude goes to the step listed first.
        "tie": lists([0, 1, VOTE], ["Solve it.", "Solve it.", "Majority."], [[], [], "all"]),
    })
    assert records["solo"].correct is False
    assert (records["fan-out"].final_answer, records["fan-out"].correct) == ("9", True)
    assert records["tie"].final_answer == "3 + 2sqrt(2)" and records["tie"].correct is False


def test_a_recursive_conductor_step_can_fan_out_to_a_vote(recorded) -> None:
    pool, workers, questions = recorded
    conductor = WorkerSeat(name="self", backend="conductor", model="c", description="the conductor itself")
    with_recursion = pool.model_copy(update={"workers": [*pool.workers, conductor]})
    # The inner workflow fans out to claude, llama-405b and deepseek, then votes.
    inner = lists([1, 3, 4, VOTE], ["Solve it."] * 3 + ["Majority."], [[], [], [], "all"])
    policy = ScriptedPolicy([inner])
    parent = lists([0, 7], ["Solve it.", "Check the answer."], [[], [0]])

    async def main():
        orch = orchestrate(with_recursion, workers, conductor_policy=policy)
        return await orch.run_workflow_text(questions[SPLIT_VOTE], parent, conductor_name="c", run_id="r", arm="a")

    record = asyncio.run(main())
    assert len(policy.calls) == 1 and "17800" in policy.calls[0][-1]["content"]  # gpt-4o's answer so far
    assert (record.final_answer, record.correct, record.infra_failure) == ("17700", True, False)


def test_training_rollouts_score_a_vote_over_the_sub_pool_their_prompt_showed(recorded) -> None:
    pool, workers, questions = recorded
    executor = PoolExecutor(pool, workers, list(questions.values()), "ordinal")
    shown = ["gemini-1.5-pro", "majority-vote", "claude-3.5-sonnet", "llama-3.1-405b", "deepseek-v2.5"]
    row = {"question_id": SPLIT_VOTE, "workers": shown}
    fan_out = lists([2, 3, 4, 1], ["Solve it."] * 3 + ["Majority."], [[], [], [], "all"])
    blind = lists([0, 1], ["Solve it.", "Majority."], [[], []])

    async def main():
        return await executor(fan_out, row), await executor(blind, row)

    voted, abstained = asyncio.run(main())
    assert (voted.parse_code, voted.correct) == ("ok", True)
    assert (abstained.parse_code, abstained.correct) == ("ok", False)  # scored, not excluded as infrastructure


def test_an_eval_conductor_arm_fans_out_to_the_vote(recorded, tmp_path: Path) -> None:
    pool, workers, questions = recorded
    warehouse = Warehouse(tmp_path / "w.duckdb")
    warehouse.insert("questions", list(questions.values()))
    solo = [seat for seat in pool.workers if seat.answers_alone]
    calibration = BestSingleChoice(worker="gpt-4o", accuracies={"gpt-4o": 1.0}, calibration_question_ids=frozenset())
    lineup = eval_lineup(solo, calibration, conductors=[ConductorArm("fan-out", ScriptedPolicy([FAN_OUT]))])
    assert "solo:majority-vote" not in lineup.names
    ordered = [questions[qid] for qid in sorted(questions)]
    asyncio.run(run_lineup(warehouse, pool, dict(workers), ordered, run_id="eval-vote", lineup=lineup))

    accuracy = dict(
        warehouse.query("SELECT arm, avg(correct::INTEGER) AS acc FROM workflows GROUP BY arm").iter_rows()
    )
    assert accuracy["conductor:fan-out"] == 1.0 and accuracy["solo:gpt-4o"] == 0.0
