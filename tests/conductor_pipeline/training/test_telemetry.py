"""Rollouts as telemetry: the executor records each rollout like an evaluation workflow, keys make
writes idempotent, a resumed run forgets what it logged past its checkpoint, and what the run logs
per step in `training_steps` agrees with its `workflows` rows.

Real components: a DuckDB warehouse in tmp_path, the orchestrator, scripted workers (a solver and
a failer) so every outcome is known in advance.
"""

from __future__ import annotations

import asyncio
import json

import polars as pl
import pytest

from conductor_pipeline.pools.backends.vote import VoteWorker
from conductor_pipeline.records import CallStatus, Question, RolloutTag, stable_id
from conductor_pipeline.training.gates import evaluate_zero_variance, running_mean
from conductor_pipeline.training.reward import ROLLOUT_POSITION, TRAINING_STEP, make_conductor_reward
from conductor_pipeline.training.rollouts import PoolExecutor
from conductor_pipeline.training.runs import (
    fan_out_share,
    halves_markdown,
    run_telemetry,
    split_halves,
    training_steps_row,
)
from conductor_pipeline.training.telemetry import (
    RolloutLog,
    RowBuffer,
    fan_out_counts,
    forget_rollouts_after,
    rollout_outcome_counts,
    rollout_workflow_id,
    telemetry_mismatches,
)
from conductor_pipeline.warehouse import Warehouse
from tests.builders import RecordingWorker, lists, make_pool, seat

QUESTIONS = [
    Question(question_id=f"gsm8k:test:{i}", corpus="gsm8k", split="test", problem=f"What is {i} times 7?", answer=str(7 * i))
    for i in range(1, 4)
]
SOLVE = lists([0], ["Solve it."], [[]])  # to the first shown worker
TWO_STEPS = lists([1, 0], ["Draft.", "Check and answer."], [[], "all"])


def _pool_and_workers(question: Question):
    """`solver` answers every question right, `failer` always wrong, `flaky` hits a transient fault."""
    pool = make_pool(seat("solver"), seat("failer"), seat("flaky"))
    workers = {
        "solver": RecordingWorker("solver", answer=question.answer),
        "failer": RecordingWorker("failer", answer="-1"),
        "flaky": RecordingWorker("flaky", status=CallStatus.TRANSIENT),
    }
    return pool, workers


def _executor(store: Warehouse, run_id: str = "grpo-test", phase: str = "grpo") -> PoolExecutor:
    pool, workers = _pool_and_workers(QUESTIONS[0])
    return PoolExecutor(pool, workers, QUESTIONS[:1], "ordinal", log=RolloutLog(RowBuffer(store), run_id, phase, "policy:test"))


def _row(position: int, step: int | None, shown=("solver", "failer")) -> dict:
    return {"question_id": QUESTIONS[0].question_id, "workers": list(shown), ROLLOUT_POSITION: position, TRAINING_STEP: step,
            "completion_ids": [[1, 2, 3]][0]}


def test_each_rollout_becomes_a_workflow_with_its_conductor_and_step_calls(tmp_path):
    store = Warehouse(tmp_path / "w.duckdb")
    executor = _executor(store)

    async def rollouts():
        verdicts = [
            await executor(SOLVE, _row(0, 3)),  # solver answers: correct
            await executor(TWO_STEPS, _row(1, 3)),  # failer drafts, solver answers last
            await executor("I would ask Model 7.", _row(2, 3)),  # unparseable
            await executor(SOLVE, _row(3, 3, shown=("flaky", "solver"))),  # Model 0 is flaky: infrastructure
        ]
        await executor.flush()
        return verdicts

    verdicts = asyncio.run(rollouts())
    assert store.query("SELECT count(*) AS n FROM workflows")["n"][0] == 0  # held until written
    executor.write_rows()
    assert [(v.parse_code, v.correct) for v in verdicts] == [("ok", True), ("ok", True), ("no_workflow", None), ("ok", None)]
    assert verdicts[3].infrastructure_failure and verdicts[0].cost_usd == pytest.approx(0.001)
    workflows = store.query("SELECT * FROM workflows ORDER BY rollout")
    assert workflows["rollout"].to_list() == [0, 1, 2, 3] and set(workflows["training_step"]) == {3}
    assert set(workflows["phase"]) == {"grpo"} and set(workflows["run_id"]) == {"grpo-test"}
    assert set(workflows["conductor"]) == {"policy:test"}
    assert workflows["workers"].to_list() == [["solver"], ["failer", "solver"], [], ["flaky"]]
    assert workflows["correct"].to_list() == [True, True, False, None]
    assert workflows["infra_failure"].to_list() == [False, False, False, True]
    tag = RolloutTag("grpo", 3, 0)
    assert workflows["workflow_id"][0] == rollout_workflow_id("grpo-test", tag, QUESTIONS[0].question_id)
    calls = store.query("SELECT kind, count(*) AS n, sum(completion_tokens) AS tokens FROM calls GROUP BY kind ORDER BY kind")
    # One conductor call per rollout (with the trainer's token count), one step call per executed step.
    assert calls.rows() == [("conductor", 4, 12), ("step", 4, 15)]
    assert rollout_outcome_counts(store, "grpo-test") == {3: {"ok": 2, "no_workflow": 1, "infrastructure": 1}}

    # The same rollouts again (a repeated run): the stable keys add nothing twice.
    asyncio.run(rollouts())
    executor.write_rows()
    assert store.query("SELECT count(*) AS n FROM workflows")["n"][0] == 4
    assert store.query("SELECT count(*) AS n FROM calls")["n"][0] == 8


def test_without_a_log_nothing_is_recorded_and_the_verdicts_are_the_same(tmp_path):
    store = Warehouse(tmp_path / "w.duckdb")
    pool, workers = _pool_and_workers(QUESTIONS[0])
    unrecorded = PoolExecutor(pool, workers, QUESTIONS[:1], "ordinal")
    recorded = _executor(store)
    texts = [SOLVE, TWO_STEPS, "nothing", lists([1], ["Solve."], [[]])]

    async def verdicts(executor):
        return [await executor(text, _row(i, 1)) for i, text in enumerate(texts)]

    assert asyncio.run(verdicts(unrecorded)) == asyncio.run(verdicts(recorded))
    unrecorded.write_rows()
    assert store.query("SELECT count(*) AS n FROM workflows")["n"][0] == 0


def test_the_reward_tags_rollouts_with_their_step_and_flushes_once_per_call(tmp_path):
    store = Warehouse(tmp_path / "w.duckdb")
    executor = _executor(store)
    reward = make_conductor_reward(executor, group_size=2)

    class State:
        global_step = 4  # four steps done: these rollouts belong to step 5

    metrics: dict[str, float] = {}
    question = QUESTIONS[0].question_id
    rewards = asyncio.run(reward(
        prompts=["p"] * 4, completions=[SOLVE, "junk", lists([1], ["Solve."], [[]]), "junk"],
        question_id=[question] * 4, workers=[["solver", "failer"]] * 4, completion_ids=[[1], [1, 2], [1], [1]],
        trainer_state=State(), log_metric=metrics.__setitem__,
    ))
    executor.write_rows()
    assert rewards == [1.0, 0.0, 0.5, 0.0]
    # Group 1 (correct, unparsed) carries a routing signal; group 2 (wrong, unparsed) only a format one.
    assert metrics["conductor/frac_groups_no_signal"] == 0.0 and metrics["conductor/frac_same_correctness"] == 0.5
    rows = store.query("SELECT training_step, rollout FROM workflows ORDER BY rollout")
    assert rows.rows() == [(5, 0), (5, 1), (5, 2), (5, 3)]
    assert rollout_outcome_counts(store, "grpo-test") == {5: reward.drain_counts()}


def test_the_buffer_writes_calls_before_workflows_and_by_itself_once_full(tmp_path):
    store = Warehouse(tmp_path / "w.duckdb")
    buffer = RowBuffer(store, flush_rows=3)
    workflow = {"workflow_id": "w1", "run_id": "r", "question_id": "q", "conductor": "c", "parse_code": "ok", "n_steps": 1}
    call = {"call_id": "c1", "run_id": "r", "kind": "step", "question_id": "q", "worker": "a", "sample": 0,
            "status": "ok", "workflow_id": "w1"}
    buffer.insert("workflows", [workflow])
    buffer.insert("calls", [call])
    assert store.query("SELECT count(*) AS n FROM calls")["n"][0] == 0  # 2 rows held, below 3
    buffer.insert("calls", [{**call, "call_id": "c2"}])  # the third row writes all of them
    assert store.query("SELECT count(*) AS n FROM calls")["n"][0] == 2
    assert store.query("SELECT count(*) AS n FROM workflows")["n"][0] == 1
    buffer.insert("no_such_table", [{"a": 1}])
    with pytest.raises(ValueError, match="no_such_table"):  # a failed write fails the run, never silently
        buffer.flush()


def test_a_resumed_run_forgets_the_rollouts_past_its_checkpoint(tmp_path):
    store = Warehouse(tmp_path / "w.duckdb")
    executor = _executor(store)

    async def steps():
        for step in (1, 2, 3):
            await executor(TWO_STEPS, _row(0, step))
        await executor.flush()

    asyncio.run(steps())
    executor.write_rows()
    forget_rollouts_after(store, "grpo-test", 2)
    assert store.query("SELECT training_step FROM workflows ORDER BY 1")["training_step"].to_list() == [1, 2]
    kept = store.query("SELECT DISTINCT workflow_id FROM calls")["workflow_id"].to_list()
    assert sorted(kept) == sorted(store.query("SELECT workflow_id FROM workflows")["workflow_id"].to_list())


def test_telemetry_agrees_with_training_steps_per_step_and_halves_compare_the_run(tmp_path):
    store = Warehouse(tmp_path / "w.duckdb")
    executor = _executor(store)
    plan = {1: [SOLVE, "junk"], 2: ["junk", "junk"], 3: [SOLVE, SOLVE], 4: [SOLVE, lists([1], ["Solve."], [[]])]}

    async def run():
        for step, texts in plan.items():
            for position, text in enumerate(texts):
                await executor(text, _row(position, step))
        await executor.flush()

    asyncio.run(run())
    executor.write_rows()
    logged = {1: {"ok": 1, "no_workflow": 1}, 2: {"no_workflow": 2}, 3: {"ok": 2}, 4: {"ok": 2}}
    for step, counts in logged.items():
        reward_mean = {1: 0.5, 2: 0.0, 3: 1.0, 4: 0.75}[step]
        store.insert("training_steps", [training_steps_row("grpo-test", "grpo", {
            "step": step, "parse_code_counts": counts, "reward_mean": reward_mean, "frac_same_correctness": 0.5,
        })])
    telemetry = run_telemetry(store, "grpo-test")
    assert telemetry.mismatches == {} and telemetry.rows == {"workflows": 8, "conductor_calls": 8, "step_calls": 5}
    first, second = telemetry.halves
    assert (first.first_step, first.last_step, second.first_step, second.last_step) == (1, 2, 3, 4)
    assert first.parse_fail_rate == 0.75 and second.parse_fail_rate == 0.0
    assert first.reward_mean == 0.25 and second.reward_mean == 0.875
    assert first.final_workers == {"(unparsed)": 0.75, "solver": 0.25}
    assert second.final_workers == {"failer": 0.25, "solver": 0.75}
    table = halves_markdown(first, second)
    assert "steps 1-2" in table and "| failer" in table and "+0.250" in table
    # A step whose rows went missing is named, with both counts.
    assert telemetry_mismatches({**logged, 5: {"ok": 2}}, rollout_outcome_counts(store, "grpo-test")) == {
        5: {"training_steps": {"ok": 2}, "workflows": {}}
    }
    assert split_halves(telemetry.steps.head(1), telemetry.final_workers) is None


def test_the_gate_reports_both_figures_and_can_judge_the_routing_signal():
    # Every group differs in reward (format: 0 vs 0.5) but never in correctness.
    rows = [{"frac_zero_std": 0.0, "frac_groups_no_signal": 0.0, "frac_same_correctness": 1.0}] * 3
    on_reward = evaluate_zero_variance(rows, probe_run_id="p", group_size=4, groups_per_step=2)
    assert on_reward.passed and on_reward.reward_figure == 0.0 and on_reward.correctness_figure == 1.0
    assert "1.000 had the same correctness" in on_reward.describe() and "judged on reward" in on_reward.describe()
    on_correctness = evaluate_zero_variance(rows, probe_run_id="p", group_size=4, groups_per_step=2, gate_on="correctness")
    assert not on_correctness.passed and on_correctness.figure == 1.0
    unmeasured = evaluate_zero_variance(
        [{"frac_zero_std": 0.0}], probe_run_id="p", group_size=4, groups_per_step=2, gate_on="correctness"
    )
    assert not unmeasured.passed and "no evidence of a routing signal" in unmeasured.detail
    assert running_mean([0.5, None, 0.0, 0.5]) == [0.5, 0.5, 0.25, 1 / 3]


def test_training_steps_rows_keep_both_signal_figures():
    row = training_steps_row("r", "probe", {"step": 1, "frac_groups_no_signal": 0.5, "frac_same_correctness": 1.0})
    assert row["frac_groups_no_signal"] == 0.5 and row["frac_same_correctness"] == 1.0
    assert json.loads(row["parse_codes"]) == {}


def test_training_curves_plot_the_running_gate_figure_and_the_final_workers():
    from conductor_pipeline.training.plots import training_curves_png

    steps = pl.DataFrame({
        "step": [1, 2, 3], "reward_mean": [0.1, 0.2, 0.4], "reward_std": [0.1, 0.1, 0.1],
        "frac_zero_std": [0.5, 0.0, 0.0], "frac_groups_no_signal": [0.5, 0.0, None], "frac_same_correctness": [1.0, 0.5, 0.5],
        "parse_fail_rate": [0.5, 0.25, 0.0], "parse_codes": ['{"ok": 1, "schema": 1}', '{"ok": 3, "schema": 1}', '{"ok": 2}'],
        "group_size": [4, 4, 4], "completion_length": [30.0, 28.0, 25.0],
    })
    workers = pl.DataFrame({"step": [1, 1, 2, 3], "final_worker": ["a", "(unparsed)", "b", "b"], "rollouts": [1, 1, 4, 2]})
    halves = ({"parse_fail_rate": 0.4, "reward_mean": 0.2, "same_correctness": None}, {"parse_fail_rate": 0.0, "reward_mean": 0.4})
    png = training_curves_png(steps, "test", 0.2, workers, halves)
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert training_curves_png(steps, "test").startswith(b"\x89PNG")  # without rollout rows
    assert stable_id("x") == stable_id("x")


def test_fan_out_share_counts_workflows_whose_final_vote_saw_two_or_more_results(tmp_path):
    """Per step: a workflow fans out when it parsed and its last step is a vote seat that saw at
    least two earlier results; a vote over one result, a single worker or an unparsed text does not."""
    store = Warehouse(tmp_path / "w.duckdb")
    pool = make_pool(seat("solver"), seat("failer"), seat("vote", backend="vote"))
    workers = {
        "solver": RecordingWorker("solver", answer=QUESTIONS[0].answer),
        "failer": RecordingWorker("failer", answer="-1"),
        "vote": VoteWorker(pool.seat("vote")),
    }
    executor = PoolExecutor(pool, workers, QUESTIONS[:1], "ordinal", log=RolloutLog(RowBuffer(store), "grpo-vote", "grpo", "p"))
    shown = ("solver", "failer", "vote")
    by_step = {
        1: [lists([0, 1, 2], ["Solve.", "Solve.", "Vote."], [[], [], [0, 1]]), SOLVE],
        2: [lists([0, 2], ["Solve.", "Vote."], [[], [0]]), "not a workflow"],
    }

    async def rollouts() -> None:
        for step, texts in by_step.items():
            for position, text in enumerate(texts):
                await executor(text, _row(position, step, shown))
        await executor.flush()

    asyncio.run(rollouts())
    executor.write_rows()
    counts = fan_out_counts(store, "grpo-vote", ["vote"])
    assert counts.rows() == [(1, 2, 1), (2, 2, 0)]  # (step, rollouts, fanned out)
    assert fan_out_share(counts) == 0.25
    assert fan_out_counts(store, "grpo-vote", []) is None  # no aggregator in the pool: no figure
    assert fan_out_counts(store, "grpo-vote", ["solver"]).rows() == [(1, 2, 0), (2, 2, 0)]
