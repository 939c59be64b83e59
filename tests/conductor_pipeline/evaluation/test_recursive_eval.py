"""Recursion in evaluation (nested workflow rows, the recursion table, tokens per top-level
workflow), the rerun that retries infrastructure failures, and batched conductor arms, on a real
DuckDB file (and the tiny local model for batching)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

import polars as pl
import pytest

from conductor_pipeline.conductor.hf_policy import HFLocalPolicy
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.conductor.protocols import BatchingPolicy, PolicyOutput
from conductor_pipeline.evaluation.arms import ConductorArm, EvalRunSummary, run_arm
from conductor_pipeline.evaluation.eval_tables import build_eval_tables
from conductor_pipeline.evaluation.lineup import ArmLineup, eval_lineup, run_lineup
from conductor_pipeline.evaluation.routers import BestSingleChoice
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat, load_pool
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import CallRequest, CallResult, CallStatus, Question
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.warehouse import Warehouse
from tests.builders import lists

RUN_ID = "eval-recursive"
PASS_THROUGH = "model_id = []\nsubtasks = []\naccess_list = []"


@dataclass
class FlakyWorker:
    """Answers questions in `solves` correctly (else -1); the first call on each question in
    `flaky` fails transiently (a provider outage), later ones answer."""

    name: str
    solves: frozenset[str]
    flaky: frozenset[str] = frozenset()
    asked: list[str] = field(default_factory=list)

    async def call(self, request: CallRequest) -> CallResult:
        qid = request.question.question_id
        first = qid not in self.asked
        self.asked.append(qid)
        if qid in self.flaky and first:
            return CallResult(status=CallStatus.TRANSIENT, error="503 after retries")
        answer = request.question.answer if qid in self.solves else "-1"
        return CallResult(
            status=CallStatus.OK, response=f"\\boxed{{{answer}}}", prompt_tokens=10, completion_tokens=10,
            cost_usd=0.01, latency_s=1.0,
        )

    async def aclose(self) -> None:
        return None


@dataclass
class RecursingPolicy:
    """Top level: even questions ask `small` and then the conductor seat, odd ones `small` alone.
    Asked again at the seat: questions 0, 4, 8, ... get a new workflow on `big`, the others pass
    the answer through."""

    name: str = "recursing"

    async def propose(self, messages, *, n=1, temperature, max_new_tokens, seed=None):
        text = messages[-1]["content"]
        number = int(re.search(r"problem (\d+)\?", text).group(1))
        if "This workflow already ran" in text:
            body = lists([1], ["redo it"], [[]]) if number % 4 == 0 else PASS_THROUGH
        elif number % 2 == 0:
            body = lists([0, 2], ["solve", "check it"], [[], "all"])
        else:
            body = lists([0], ["solve"], [[]])
        return [PolicyOutput(text=body, prompt_tokens=50, completion_tokens=20, latency_s=0.2)] * n

    async def aclose(self) -> None:
        return None


def seat(name: str, backend: str = "replay") -> WorkerSeat:
    extra = {"replay_source": "zeroeval"} if backend == "replay" else {}
    return WorkerSeat(name=name, backend=backend, model=name, description=f"the {name} one", **extra)


def questions(n: int) -> list[Question]:
    return [
        Question(question_id=f"q{i:03d}", corpus="math", split="test", problem=f"problem {i}?", answer=str(i))
        for i in range(n)
    ]


def recursive_lineup(pool: PoolConfig):
    choice = BestSingleChoice(worker="big", accuracies={"big": 1.0}, calibration_question_ids=frozenset())
    solo_seats = [s for s in pool.workers if s.answers_alone]
    return eval_lineup(solo_seats, choice, conductors=[ConductorArm("recursing", RecursingPolicy(), recursive=True)])


def run(store: Warehouse, pool: PoolConfig, workers: dict, qs: list[Question], lineup) -> None:
    asyncio.run(run_lineup(store, pool, workers, qs, run_id=RUN_ID, lineup=lineup))


def test_the_shipped_recursive_pool_makes_conductor_arms_recursive():
    pool = load_pool("replay-mixed6-recursive")
    assert any(s.is_conductor for s in pool.workers)
    arm = ConductorArm("hf:x", RecursingPolicy(), recursive=True)
    assert arm.name == "conductor:hf:x+recursive" and ConductorArm("hf:x", RecursingPolicy()).name == "conductor:hf:x"


def test_recursive_arm_rows_link_to_parent_and_root_and_the_recursion_table(tmp_path):
    pool = PoolConfig(name="eval-recursive", workers=[seat("small"), seat("big"), seat("self", "conductor")])
    qs = questions(8)
    odd = frozenset(q.question_id for q in qs[1::2])
    workers = {"small": FlakyWorker("small", odd), "big": FlakyWorker("big", frozenset(q.question_id for q in qs))}
    store = Warehouse(tmp_path / "w.duckdb")
    lineup = recursive_lineup(pool)
    arm = "conductor:recursing+recursive"
    assert lineup.names[-1] == arm
    run(store, pool, workers, qs, lineup)

    top = store.query_file("eval_workflows", {"run_id": RUN_ID}).filter(pl.col("arm") == arm)
    inner = store.query_file("eval_inner_workflows", {"run_id": RUN_ID})
    assert top.height == 8 and inner.height == 4  # one reply of the seat per even question
    top_id = dict(zip(top["question_id"], top["workflow_id"], strict=True))
    for row in inner.iter_rows(named=True):
        assert row["parent_workflow_id"] == row["root_workflow_id"] == top_id[row["question_id"]]
        assert row["parent_step"] == 1 and row["depth"] == 1 and row["arm"] == arm
    by_question = {r["question_id"]: r for r in inner.iter_rows(named=True)}
    assert by_question["q000"]["workers"] == ["big"] and by_question["q000"]["correct"] is True
    assert by_question["q002"]["n_steps"] == 0 and by_question["q002"]["correct"] is False  # passed -1 through
    correct = dict(zip(top["question_id"], top["correct"], strict=True))
    assert correct == {q.question_id: int(q.question_id[1:]) % 4 != 2 for q in qs}

    # Tokens per top-level workflow gather its nested workflows' calls (which carry their own id).
    tokens = store.query_file("eval_workflow_tokens", {"run_id": RUN_ID})
    assert set(tokens["workflow_id"]) == set(store.query_file("eval_workflows", {"run_id": RUN_ID})["workflow_id"])
    per_workflow = dict(zip(tokens["workflow_id"], tokens["tokens"], strict=True))
    # q000: its conductor (70) + small (20) + the seat's reply (70) + big in the nested workflow (20).
    assert per_workflow[top_id["q000"]] == 180 and per_workflow[top_id["q002"]] == 160
    assert per_workflow[top_id["q001"]] == 90
    costs = dict(zip(top["question_id"], top["cost_usd"], strict=True))
    assert costs["q000"] == pytest.approx(0.02) and costs["q001"] == pytest.approx(0.01)

    workflows = store.query_file("eval_workflows", {"run_id": RUN_ID})
    summary = EvalRunSummary(
        run_id=RUN_ID, corpus="math", slice_ids=tuple(q.question_id for q in qs), planned_size=8,
        split_fingerprint="fp", repeats=1, arms=tuple(lineup.names), best_single_worker="big",
    )
    tables = build_eval_tables(summary, workflows, tokens, inner_workflows=inner)
    (row,) = tables.recursion.iter_rows(named=True)
    assert row == {
        "arm": arm, "workflows": 8, "steps_top_level": 1.5, "steps_with_inner": 1.75, "inner_workflows": 4,
        "share_recursed": 0.25, "pass_throughs": 2, "inner_unparsed": 0, "max_depth": 1,
        "accuracy_recursed": 1.0, "n_recursed": 2, "accuracy_not_recursed": pytest.approx(4 / 6), "n_not_recursed": 6,
    }
    assert "| conductor:recursing+recursive |" in tables.markdown["recursion"]
    # No recursive arm, no recursion section.
    flat = build_eval_tables(summary, workflows.filter(pl.col("arm") != arm), tokens)
    assert flat.recursion is None and "recursion" not in flat.markdown


def test_a_rerun_retries_the_infrastructure_failures_and_skips_completed_workflows(tmp_path):
    pool = PoolConfig(name="eval-recursive", workers=[seat("small"), seat("big"), seat("self", "conductor")])
    qs = questions(8)
    # small fails once on q003 (a solo and a top-level step); big once on q004, which the
    # conductor arm only reaches inside a nested workflow (and solo:big reaches first).
    workers = {
        "small": FlakyWorker("small", frozenset(), flaky=frozenset({"q003"})),
        "big": FlakyWorker("big", frozenset(q.question_id for q in qs), flaky=frozenset({"q004"})),
    }
    store = Warehouse(tmp_path / "w.duckdb")
    lineup = recursive_lineup(pool)
    run(store, pool, workers, qs, lineup)
    first = store.query_file("eval_workflows", {"run_id": RUN_ID})
    failed = first.filter(pl.col("infra_failure"))
    assert sorted(zip(failed["arm"], failed["question_id"])) == [("solo:big", "q004"), ("solo:small", "q003")]
    calls_before = store.query("SELECT count(*) AS n FROM calls")["n"][0]
    asked_before = {name: len(w.asked) for name, w in workers.items()}

    run(store, pool, workers, qs, lineup)
    second = store.query_file("eval_workflows", {"run_id": RUN_ID})
    assert second.height == first.height and not second["infra_failure"].any()
    # Only the two failed workflows ran again: one call each.
    assert {name: len(w.asked) - asked_before[name] for name, w in workers.items()} == {"small": 1, "big": 1}
    completed = first.filter(~pl.col("infra_failure"))
    unchanged = second.join(completed.select("workflow_id", "correct"), on="workflow_id")
    assert unchanged.height == completed.height and (unchanged["correct"] == unchanged["correct_right"]).all()
    # The failed attempts' calls were replaced, not added to.
    assert store.query("SELECT count(*) AS n FROM calls")["n"][0] == calls_before
    assert store.query("SELECT count(*) AS n FROM calls WHERE status = 'transient'")["n"][0] == 0


def test_a_nested_infrastructure_failure_is_retried_with_its_nested_rows(tmp_path):
    pool = PoolConfig(name="eval-recursive", workers=[seat("small"), seat("big"), seat("self", "conductor")])
    qs = questions(4)
    workers = {"small": FlakyWorker("small", frozenset()), "big": FlakyWorker("big", frozenset({"q000"}))}
    store = Warehouse(tmp_path / "w.duckdb")
    # The conductor arm alone: big's first call on q000 is then its nested workflow's only step.
    lineup = ArmLineup(solo=(), routers=(), conductors=recursive_lineup(pool).conductors)
    workers["big"].flaky = frozenset({"q000"})
    run(store, pool, workers, qs, lineup)
    inner = store.query_file("eval_inner_workflows", {"run_id": RUN_ID})
    q0 = inner.filter(pl.col("question_id") == "q000")
    assert q0["infra_failure"].to_list() == [True]
    top = store.query_file("eval_workflows", {"run_id": RUN_ID})
    assert top.filter(pl.col("infra_failure"))["question_id"].to_list() == ["q000"]

    run(store, pool, workers, qs, lineup)
    inner = store.query_file("eval_inner_workflows", {"run_id": RUN_ID})
    assert inner.height == 2 and not inner["infra_failure"].any()  # q000 and q002 replied once each
    top = store.query_file("eval_workflows", {"run_id": RUN_ID})
    assert top.height == 4 and not top["infra_failure"].any()
    assert top.filter(pl.col("question_id") == "q000")["correct"].to_list() == [True]


def test_a_local_conductor_arm_generates_in_batches_with_the_same_texts(tmp_path):
    """The arm's batched path (propose_batch across questions) at temperature 0 writes the
    workflows one prompt at a time would; a seeded sampling rerun writes the same texts."""
    pool = PoolConfig(name="eval-batch", workers=[seat("small"), seat("big")])
    workers = {"small": FlakyWorker("small", frozenset()), "big": FlakyWorker("big", frozenset())}
    policy = HFLocalPolicy(build_tiny_causal_lm(tmp_path / "tiny"))
    assert isinstance(policy, BatchingPolicy)
    qs = questions(5)

    def texts(arm: ConductorArm, run_id: str, *, batched: bool) -> dict[str, str]:
        store = Warehouse(tmp_path / f"{run_id}.duckdb")
        orchestrator = Orchestrator(pool, workers, Governor.from_pool(pool), store)

        async def main():
            if batched:
                await run_arm(orchestrator, arm, qs, run_id=run_id, max_concurrent=3)
            else:
                for q in qs:
                    await arm.answer(orchestrator, q, run_id=run_id, repeat=0)
                await orchestrator.flush()

        asyncio.run(main())
        rows = store.query("SELECT question_id, raw_text FROM workflows")
        return dict(zip(rows["question_id"], rows["raw_text"], strict=True))

    greedy = ConductorArm("tiny", policy, temperature=0.0, max_new_tokens=10)
    assert texts(greedy, "greedy-batched", batched=True) == texts(greedy, "greedy-alone", batched=False)
    sampled = ConductorArm("tiny", policy, temperature=1.0, max_new_tokens=10)
    first = texts(sampled, "sampled-1", batched=True)
    assert texts(sampled, "sampled-2", batched=True) == first and len(first) == 5
