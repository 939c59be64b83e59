"""The eval slice and leak check, baseline routers, arms through the orchestrator, and the tables."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import numpy as np
import polars as pl
import pytest

from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.conductor.protocols import PolicyError, PolicyOutput
from conductor_pipeline.corpora.loaders import load_gsm8k, load_math_full
from conductor_pipeline.evaluation.arms import ConductorArm, OracleArm, RouterArm, SoloArm, run_arm
from conductor_pipeline.evaluation.frames import (
    arm_table,
    common_questions,
    decompose_gap,
    decomposition_inputs,
    n_label,
    parse_code_histogram,
    running_gap,
    worker_usage,
)
from conductor_pipeline.evaluation.lineup import conductor_twins, eval_lineup, eval_run_id, run_lineup
from conductor_pipeline.evaluation.routers import (
    BestSingleRouter,
    CalibrationError,
    OracleRouter,
    RandomRouter,
    choose_best_single,
    solo_verdicts,
)
from conductor_pipeline.evaluation.slices import (
    SliceSpec,
    UnrecordedSliceError,
    assert_no_leak,
    eval_candidates,
    eval_slice,
    find_leaks,
)
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat, load_pool
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import CallRequest, CallResult, CallStatus, Question
from conductor_pipeline.splits import SplitLeakError, split_fingerprint, split_of
from conductor_pipeline.warehouse import Warehouse
from tests.shared_data import require_shared_data

IDS = [f"test/algebra/{i}.json" for i in range(400)]
EVAL_IDS = [q for q in IDS if split_of(q) == "eval"]
TRAIN_IDS = [q for q in IDS if split_of(q) == "train"]


def test_eval_slice_takes_the_first_eval_split_ids_in_id_order_and_records_the_split():
    chosen = eval_slice(reversed(IDS), size=30)
    assert chosen.question_ids == tuple(sorted(EVAL_IDS)[:30])
    assert all(split_of(q) == "eval" for q in chosen.question_ids)
    assert chosen.planned_size == 30 and chosen.split_fingerprint == split_fingerprint()
    small = eval_slice(EVAL_IDS[:10], size=400)
    assert small.size == 10 and small.planned_size == 400
    hashed = eval_slice(IDS, size=30, order="hashed")
    assert set(hashed.question_ids) <= set(EVAL_IDS) and hashed.question_ids != chosen.question_ids


def test_a_replay_pool_whose_seats_share_no_recorded_question_of_the_corpus_is_refused_naming_the_seats(
    tmp_path, monkeypatch
):
    """Seats recorded on other corpora leave a replay pool's slice empty: the eval stops there,
    naming them, not later at the best single's calibration."""
    require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs", "gsm8k_test", "math_full")
    store = Warehouse(tmp_path / "w.duckdb")
    store.insert("questions", [*load_gsm8k("test"), *load_math_full()])
    zoo = {seat.name: seat for seat in load_pool("replay-zeroeval-all").workers}
    math_only, gsm8k_only = zoo["qwen2.5-72b"], zoo["command-r-plus"]  # as ZeroEval recorded them

    def candidates(*seats: WorkerSeat, corpus: str = "math"):
        pool = PoolConfig(name="uncovered", workers=list(seats))
        spec = SliceSpec(corpus, ("test",), (5,), size=400, order="question_id", only_recorded=True)
        return eval_candidates(store, build_workers(pool), spec)

    covered, restricted = candidates(math_only, zoo["gpt-4o"])
    assert restricted and len(covered) == 721
    with pytest.raises(UnrecordedSliceError, match=r"command-r-plus recorded none of them") as refused:
        candidates(math_only, gsm8k_only, zoo["gpt-4o"])
    counts = "of its 1324 questions each seat recorded command-r-plus 0, gpt-4o 721, qwen2.5-72b 721"
    assert counts in str(refused.value)
    with pytest.raises(UnrecordedSliceError, match=r"qwen2.5-72b recorded none of them"):
        candidates(math_only, gsm8k_only, corpus="gsm8k")


def test_leak_check_names_training_calibration_and_train_split_ids():
    chosen = eval_slice(IDS, size=20).question_ids
    assert_no_leak(chosen, training_ids=TRAIN_IDS, calibration_ids=TRAIN_IDS[:50])
    leaks = find_leaks(chosen, training_ids=[chosen[0]], calibration_ids=[chosen[1]])
    assert leaks["training"] == [chosen[0]] and leaks["calibration"] == [chosen[1]]
    with pytest.raises(SplitLeakError, match="calibration"):
        assert_no_leak(chosen, calibration_ids=[chosen[3]])
    with pytest.raises(SplitLeakError, match="train_split"):
        assert_no_leak([TRAIN_IDS[0]])


def test_best_single_is_chosen_on_the_train_split_only():
    rows = []
    for q in IDS:
        on_eval = split_of(q) == "eval"
        # On eval questions "cheat" would win; on the calibration (train) split "honest" wins.
        rows.append({"question_id": q, "worker": "honest", "successes": 0 if on_eval else 3, "samples": 3})
        rows.append({"question_id": q, "worker": "cheat", "successes": 3 if on_eval else 1, "samples": 3})
    choice = choose_best_single(pl.DataFrame(rows), ["honest", "cheat"])
    assert choice.worker == "honest"
    assert choice.calibration_question_ids == frozenset(TRAIN_IDS)
    assert choice.accuracies["cheat"] == pytest.approx(1 / 3)
    with pytest.raises(CalibrationError):
        choose_best_single(pl.DataFrame(rows).filter(pl.col("question_id").is_in(EVAL_IDS)), ["honest", "cheat"])


def test_random_router_is_seeded_and_oracle_routes_to_a_solver():
    question = Question(question_id="q1", corpus="math", split="test", problem="p", answer="1")
    router = RandomRouter(("a", "b", "c"), seed=3)
    picks = {router.route(question, r).steps[0].worker for r in range(30)}
    assert picks == {"a", "b", "c"}
    assert router.route(question, 5) == RandomRouter(("a", "b", "c"), seed=3).route(question, 5)
    verdicts = solo_verdicts(
        [{"question_id": "q1", "worker": "a", "correct": False}, {"question_id": "q1", "worker": "c", "correct": True}]
    )
    assert OracleRouter(verdicts, fallback="a").route(question).steps[0].worker == "c"
    assert OracleRouter({}, fallback="a").route(question).steps[0].worker == "a"


# ------------------------------------------------------------------- arms through the orchestrator


@dataclass
class SolverWorker:
    """Answers correctly exactly on `solves`; `down` questions stay transient (provider outage)."""

    name: str
    solves: frozenset[str]
    down: frozenset[str] = frozenset()

    async def call(self, request: CallRequest) -> CallResult:
        qid = request.question.question_id
        if qid in self.down:
            return CallResult(status=CallStatus.TRANSIENT, error="503 after retries")
        answer = request.question.answer if qid in self.solves else "-1"
        return CallResult(
            status=CallStatus.OK, response=f"\\boxed{{{answer}}}", prompt_tokens=10, completion_tokens=10,
            cost_usd=0.01 if self.name == "big" else 0.001, latency_s=1.0,
        )

    async def aclose(self) -> None:
        return None


@dataclass
class RoutingPolicy:
    """A conductor that always picks Model 1 ("big"), except on every 4th question: junk."""

    name: str = "routing"

    async def propose(self, messages, *, n=1, temperature, max_new_tokens, seed=None):
        text = messages[-1]["content"]
        junk = any(f"problem {i}?" in text for i in range(0, 200, 4))
        body = "no plan" if junk else 'model_id = [1]\nsubtasks = ["Solve the problem."]\naccess_list = [[]]'
        return [PolicyOutput(text=body, prompt_tokens=50, completion_tokens=20, latency_s=0.2)] * n

    async def aclose(self) -> None:
        return None


class DownPolicy:
    name = "down"

    async def propose(self, messages, *, n=1, temperature, max_new_tokens, seed=None):
        raise PolicyError("endpoint failed after 4 attempts: HTTP 503")

    async def aclose(self) -> None:
        return None


def seat(name: str) -> WorkerSeat:
    return WorkerSeat(name=name, backend="replay", replay_source="zeroeval", model=name, description=f"the {name} one")


def numbered_questions(n: int) -> list[Question]:
    """Questions q000.. whose answer is their number (RoutingPolicy reads `problem {i}?`)."""
    return [
        Question(question_id=f"q{i:03d}", corpus="math", split="test", problem=f"problem {i}?", answer=str(i))
        for i in range(n)
    ]


def test_arms_tables_running_gap_and_decomposition(tmp_path):
    questions = numbered_questions(80)
    ids = [q.question_id for q in questions]
    pool = PoolConfig(name="eval-test", workers=[seat("small"), seat("big")])
    workers = {
        "small": SolverWorker("small", frozenset(ids[:30]) | frozenset(ids[70:])),
        "big": SolverWorker("big", frozenset(ids[20:70]), down=frozenset({ids[5]})),
    }
    warehouse = Warehouse(tmp_path / "w.duckdb")
    run_id = "eval-test-run"

    async def main():
        orch = Orchestrator(pool, workers, Governor.from_pool(pool), warehouse)
        for worker in ("small", "big"):
            await run_arm(orch, SoloArm(worker), questions, run_id=run_id, repeats=2)
        solo = warehouse.query(
            "SELECT question_id, workers[1] AS worker, correct FROM workflows WHERE arm LIKE 'solo:%'"
        )
        arms = [
            RouterArm(RandomRouter(("small", "big"), seed=1)),
            RouterArm(BestSingleRouter(_choice("big"))),
            RouterArm(OracleRouter(solo_verdicts(solo.iter_rows(named=True)), fallback="big")),
            ConductorArm("routing", RoutingPolicy()),
        ]
        for arm in arms:
            await run_arm(orch, arm, questions, run_id=run_id, repeats=2)
        # A rerun skips what is recorded: nothing new is executed.
        done = frozenset(warehouse.query("SELECT workflow_id FROM workflows")["workflow_id"].to_list())
        again = await run_arm(orch, SoloArm("small"), questions, run_id=run_id, repeats=2, skip_workflow_ids=done)
        assert again == []
        down = await run_arm(orch, ConductorArm("down", DownPolicy()), questions[:3], run_id="other", repeats=1)
        assert all(r.infra_failure and r.parse_code == "not_run" for r in down)

    asyncio.run(main())
    # The conductor's failed calls are kept, unscored, with the provider's error.
    failed = warehouse.query("SELECT status, correct, error FROM calls WHERE run_id = 'other' AND kind = 'conductor'")
    assert failed.height == 3 and failed["status"].unique().to_list() == ["transient"]
    assert failed["correct"].null_count() == 3 and all("HTTP 503" in e for e in failed["error"])
    workflows = warehouse.query("SELECT * FROM workflows WHERE run_id = $r", {"r": run_id})
    assert workflows.height == 80 * 2 * 6
    common = common_questions(workflows)
    assert len(common) == 79 and ids[5] not in common  # big was down on q005 in every arm that used it

    tokens = warehouse.query(
        "SELECT workflow_id, sum(prompt_tokens + completion_tokens)::DOUBLE AS tokens FROM calls GROUP BY ALL"
    )
    table = arm_table(workflows, planned_size=100, call_tokens=tokens, slice_order=ids)
    by_arm = {row["arm"]: row for row in table.iter_rows(named=True)}
    assert by_arm["solo:big"]["accuracy"] == pytest.approx(50 / 79)
    assert by_arm["solo:small"]["accuracy"] == pytest.approx(39 / 79)
    assert by_arm["oracle"]["accuracy"] == pytest.approx(79 / 79)
    assert by_arm["best_single"]["accuracy"] == pytest.approx(50 / 79)
    # Identical repeats are one sample, not two: no SE over repeats, and a Wilson interval over
    # the questions instead of a zero-width one. These live fakes are not replay recordings.
    assert by_arm["solo:big"]["se"] is None and by_arm["solo:big"]["se_note"] == "n/a (identical repeats)"
    assert by_arm["solo:big"]["ci_low"] < by_arm["solo:big"]["accuracy"] < by_arm["solo:big"]["ci_high"]
    assert by_arm["solo:big"]["ci_high"] - by_arm["solo:big"]["ci_low"] > 0.15  # about +-0.1 at n=79
    # The random router draws anew per repeat: its repeats differ, so its SE is over repeats.
    assert by_arm["random"]["se"] is not None and by_arm["random"]["se_note"] is None
    recorded = arm_table(workflows, planned_size=100, slice_order=ids, single_recording_workers={"small", "big"})
    assert set(recorded.filter(pl.col("kind") == "worker")["se_note"]) == {"n/a (one recording)"}
    assert recorded["arm"].to_list()[:2] == ["solo:big", "solo:small"]  # workers first, most accurate first
    assert recorded["arm"].to_list()[-1] == "conductor:routing"  # conductors last
    assert by_arm["conductor:routing"]["tokens_per_question"] == pytest.approx((79 * 70 + 59 * 20) / 79)
    assert by_arm["solo:big"]["cost_per_question"] == pytest.approx(0.01)
    assert "stopped early: 80 of 100" in by_arm["oracle"]["n_label"]
    assert by_arm["conductor:routing"]["mean_steps"] == pytest.approx(1.0)

    histogram = parse_code_histogram(workflows.filter(pl.col("arm") == "conductor:routing"))
    assert dict(histogram.select("parse_code", "workflows").iter_rows()) == {"ok": 118, "no_workflow": 40}
    usage = worker_usage(workflows.filter(pl.col("arm") == "random"))
    assert usage["share"].sum() == pytest.approx(1.0) and set(usage["worker"]) == {"small", "big"}

    gap = running_gap(workflows, slice_order=ids)
    assert sorted(set(gap["n"])) == [50, 75]
    assert set(gap["best_solo"]) == {"solo:big"}
    assert gap.filter(pl.col("arm") == "solo:big")["gap"].to_list() == [0.0, 0.0]

    solo, conductor = decomposition_inputs(workflows, "conductor:routing", common)
    row = decompose_gap(solo, conductor)
    assert row["n_questions"] == 79 and row["best_worker"] == "big"
    assert row["oracle"] == pytest.approx(1.0)
    assert row["unparseable"] == pytest.approx(20 / 79)
    assert row["solvable_unparseable"] + row["solvable_reached_solver"] + row["solvable_only_non_solvers"] == 79


class FlatWorldModel:
    """A world model that rates every worker the same: the W-router takes the first seat."""

    training_question_ids = frozenset()

    def predict_success(self, subtasks, workers):
        return np.full((len(subtasks), len(workers)), 0.5)

    def predict_cost(self, subtasks, workers):
        return np.zeros((len(subtasks), len(workers)))


class BatchSizePolicy:
    """A batching conductor whose pick depends on its batch, as sampled text can: "big" for rows of
    a batch of four, "small" otherwise. `batches` records each batch's prompts' questions."""

    name = "batch-size"

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def propose(self, messages, *, n=1, temperature, max_new_tokens, seed=None):
        return await self.propose_batch([messages] * n, temperature=temperature, max_new_tokens=max_new_tokens,
                                        seeds=[seed] * n)

    async def propose_batch(self, prompts, *, temperature, max_new_tokens, seeds):
        self.batches.append([p[-1]["content"].split("problem ")[-1] for p in prompts])
        worker = 1 if len(prompts) == 4 else 0
        body = f'model_id = [{worker}]\nsubtasks = ["Solve the problem."]\naccess_list = [[]]'
        return [PolicyOutput(text=body, prompt_tokens=50, completion_tokens=20, latency_s=0.0) for _ in prompts]

    async def aclose(self) -> None:
        return None


def test_a_resumed_conductor_arm_generates_the_batches_of_an_uninterrupted_run(tmp_path):
    questions = numbered_questions(10)
    pool = PoolConfig(name="eval-test", workers=[seat("small"), seat("big")])
    ids = frozenset(q.question_id for q in questions)
    workers = {"small": SolverWorker("small", frozenset()), "big": SolverWorker("big", ids)}

    def run(warehouse: Warehouse, policy: BatchSizePolicy, skip: frozenset[str] = frozenset()) -> None:
        async def main():
            orch = Orchestrator(pool, workers, Governor.from_pool(pool), warehouse)
            arm = ConductorArm("batched", policy)
            await run_arm(orch, arm, questions, run_id="eval-resume", max_concurrent=4, skip_workflow_ids=skip)
            await orch.aclose()

        asyncio.run(main())

    def picks(warehouse: Warehouse) -> dict[str, str]:
        rows = warehouse.query("SELECT question_id, workers[1] AS worker FROM workflows ORDER BY question_id")
        return dict(zip(rows["question_id"], rows["worker"], strict=True))

    whole = Warehouse(tmp_path / "whole.duckdb")
    run(whole, BatchSizePolicy())
    # A kill after q005 was recorded: q000-q005 are on file, the rest of the second batch is not.
    resumed = Warehouse(tmp_path / "resumed.duckdb")
    run(resumed, BatchSizePolicy())
    with resumed.connect() as con:
        con.execute("DELETE FROM calls WHERE question_id > 'q005'")
        con.execute("DELETE FROM workflows WHERE question_id > 'q005'")
    done = frozenset(resumed.query("SELECT workflow_id FROM workflows")["workflow_id"].to_list())
    again = BatchSizePolicy()
    run(resumed, again, skip=done)
    # The first batch is complete and not generated; the second is generated whole; the third as before.
    assert again.batches == [["4?", "5?", "6?", "7?"], ["8?", "9?"]]
    assert picks(resumed) == picks(whole)
    assert resumed.query("SELECT count(*) AS n FROM workflows")["n"][0] == 10


def test_a_batching_conductor_generates_the_next_group_while_a_group_runs(tmp_path):
    questions = numbered_questions(8)
    pool = PoolConfig(name="eval-test", workers=[seat("small"), seat("big")])
    events: list[str] = []

    class LoggedSolver(SolverWorker):
        async def call(self, request: CallRequest) -> CallResult:
            events.append(f"call {request.question.question_id}")
            return await super().call(request)

    class LoggedPolicy(BatchSizePolicy):
        async def propose_batch(self, prompts, **settings):
            outputs = await super().propose_batch(prompts, **settings)
            events.append(f"generate {self.batches[-1][0]}")
            return outputs

    ids = frozenset(q.question_id for q in questions)
    workers = {"small": LoggedSolver("small", frozenset()), "big": LoggedSolver("big", ids)}

    def run(arm: ConductorArm) -> Warehouse:
        events.clear()
        warehouse = Warehouse(tmp_path / f"{arm.name}.duckdb")

        async def main():
            orch = Orchestrator(pool, workers, Governor.from_pool(pool), warehouse)
            await run_arm(orch, arm, questions, run_id="eval-pipelined", max_concurrent=4)
            await orch.aclose()

        asyncio.run(main())
        return warehouse

    policy = LoggedPolicy()
    warehouse = run(ConductorArm("batched", policy))
    # The second group's texts are asked for before the first group's workflows call a worker ...
    assert events.index("generate 4?") < events.index("call q000")
    # ... and the groups are the batches of a run that waits: the same texts, every workflow once.
    assert policy.batches == [["0?", "1?", "2?", "3?"], ["4?", "5?", "6?", "7?"]]
    rows = warehouse.query("SELECT question_id, workers[1] AS worker FROM workflows ORDER BY question_id")
    assert rows["question_id"].to_list() == sorted(ids) and set(rows["worker"]) == {"big"}
    # A recursive arm's workflows call the policy themselves: it generates a group after the last ran.
    recursive = LoggedPolicy()
    run(ConductorArm("batched", recursive, recursive=True))
    assert events.index("call q003") < events.index("generate 4?")
    assert recursive.batches == policy.batches


def test_lineup_names_every_arm_once_in_run_id_order_and_the_run_id_is_stable():
    lineup = eval_lineup(
        [seat("small"), seat("big")], _choice("big"), world_model=FlatWorldModel(),
        conductors=[ConductorArm("routing", RoutingPolicy())],
    )
    names = ["solo:small", "solo:big", "best_single", "random", "oracle", "w_router", "conductor:routing"]
    assert lineup.names == names == [arm.name for arm in lineup.arms]
    assert eval_lineup([seat("small")], _choice("small")).names == ["solo:small", "best_single", "random", "oracle"]
    # The hash of these parts, in this order, keys every evaluation run recorded so far: a changed
    # formula would silently start new runs instead of resuming recorded ones.
    recorded_only = SliceSpec("math", ("test",), (5,), size=400, order="question_id", only_recorded=True)

    def run_id(spec: SliceSpec) -> str:
        return eval_run_id(
            pool="eval-test", spec=spec, repeats=1, split_fingerprint="fp0123", include_question=True, max_depth=2,
            arm_names=lineup.names, random_seed=0, w_router_lambda_cost=0.0,
        )

    assert run_id(recorded_only) == "eval-2ce01ab061dc08a41fb64224"
    # A slice drawn from every question, recorded or not, is another slice: another run.
    assert run_id(dataclasses.replace(recorded_only, only_recorded=False)) != run_id(recorded_only)


def test_conductor_twins_pair_a_trained_arm_with_its_warm_start_and_each_pool_order_arm_with_its_shuffle():
    arms = {
        ("trained", "pool"): "conductor:trained", ("trained", "shuffled"): "conductor:trained@shuffled",
        ("warm", "pool"): "conductor:warm", ("warm", "shuffled"): "conductor:warm@shuffled",
        ("endpoint", "pool"): "conductor:endpoint",
    }
    twins = conductor_twins(arms, trained="trained", warm_start="warm")
    assert twins.started_from == {
        "conductor:trained": "conductor:warm", "conductor:trained@shuffled": "conductor:warm@shuffled",
    }
    assert twins.order_twins == {
        "conductor:trained": "conductor:trained@shuffled", "conductor:warm": "conductor:warm@shuffled",
    }
    # No warm start evaluated (or none trained): nothing to say what GRPO changed.
    assert conductor_twins(arms, trained="trained", warm_start=None).started_from == {}
    assert conductor_twins(arms, trained=None, warm_start="warm").started_from == {}
    # A warm start evaluated in pool order only pairs the pool-order arm alone.
    pool_only_warm = {key: name for key, name in arms.items() if key != ("warm", "shuffled")}
    assert conductor_twins(pool_only_warm, trained="trained", warm_start="warm").started_from == {
        "conductor:trained": "conductor:warm",
    }


def test_run_lineup_runs_every_arm_and_the_oracle_on_the_solo_verdicts(tmp_path):
    questions = numbered_questions(12)
    ids = [q.question_id for q in questions]
    pool = PoolConfig(name="eval-test", workers=[seat("small"), seat("big")])
    workers = {"small": SolverWorker("small", frozenset(ids[:4])), "big": SolverWorker("big", frozenset(ids[4:8]))}
    warehouse = Warehouse(tmp_path / "w.duckdb")
    conductors = [ConductorArm("routing", RoutingPolicy())]
    lineup = eval_lineup(pool.workers, _choice("big"), world_model=FlatWorldModel(), conductors=conductors)
    with pytest.raises(RuntimeError, match="solo arms' verdicts"):
        asyncio.run(OracleArm(fallback="big").answer(None, questions[0], run_id="r", repeat=0))
    logged: list[str] = []
    asyncio.run(run_lineup(warehouse, pool, workers, questions, run_id="eval-lineup", lineup=lineup, log=logged.append))

    workflows = warehouse.query("SELECT * FROM workflows WHERE run_id = 'eval-lineup'")
    accuracy = dict(workflows.group_by("arm").agg(pl.col("correct").cast(pl.Float64).mean()).iter_rows())
    assert set(accuracy) == set(lineup.names) and len(logged) == len(lineup.names)
    assert accuracy["oracle"] == pytest.approx(8 / 12) and accuracy["best_single"] == pytest.approx(4 / 12)
    assert accuracy["w_router"] == pytest.approx(4 / 12)  # a flat W picks the first seat, "small"
    # A rerun records nothing new.
    asyncio.run(run_lineup(warehouse, pool, workers, questions, run_id="eval-lineup", lineup=lineup))
    assert warehouse.query("SELECT count(*) AS n FROM workflows")["n"][0] == workflows.height


def _choice(worker: str):
    from conductor_pipeline.evaluation.routers import BestSingleChoice

    return BestSingleChoice(worker=worker, accuracies={worker: 1.0}, calibration_question_ids=frozenset())


def test_n_label_says_when_a_run_stopped_early():
    assert n_label(400, 400, 400) == "n=400 of 400 planned"
    assert "stopped early: 120 of 400" in n_label(118, 120, 400)
    assert "2 excluded" in n_label(398, 400, 400)
    # a slice smaller than planned because the split has fewer questions is not an early stop
    assert n_label(384, 384, 400, available=384) == "n=384 of 400 planned (the eval split holds only 384 eligible questions)"
    assert "stopped early: 100 of 384" in n_label(100, 100, 400, available=384)


@dataclass
class FirstShownPolicy:
    """A conductor that always sends the question to the first worker its catalogue lists."""

    name: str = "first-shown"

    async def propose(self, messages, *, n=1, temperature, max_new_tokens, seed=None):
        body = 'model_id = [0]\nsubtasks = ["Solve the problem."]\naccess_list = [[]]'
        return [PolicyOutput(text=body, prompt_tokens=50, completion_tokens=20, latency_s=0.2)] * n

    async def aclose(self) -> None:
        return None


def test_a_ranked_arm_lists_the_pool_by_ws_numbers_so_the_first_line_is_ws_pick(tmp_path):
    questions = numbered_questions(12)
    pool = PoolConfig(name="ranked-test", workers=[seat("small"), seat("big")])
    ids = [q.question_id for q in questions]
    workers = {"small": SolverWorker("small", frozenset(ids[::2])), "big": SolverWorker("big", frozenset(ids[1::2]))}
    asked: list[str] = []

    def predicted(question: Question) -> dict[str, float]:
        asked.append(question.question_id)
        even = int(question.question_id[1:]) % 2 == 0
        return {"small": 0.8 if even else 0.3, "big": 0.4 if even else 0.6}

    for order in ("pool", "shuffled"):
        asked.clear()
        arm = ConductorArm("ranked", FirstShownPolicy(), predicted_success=predicted, ranked=True, catalogue_order=order)

        async def main(arm=arm):
            orch = Orchestrator(pool, workers, Governor.from_pool(pool), Warehouse(tmp_path / f"{order}.duckdb"))
            assert "- Model 0: the big one (predicted success on this question: 60%)" in arm.prompt(orch, questions[1])[0]["content"]
            return await run_arm(orch, arm, questions, run_id=f"ranked-{order}", repeats=1)

        records = asyncio.run(main())
        assert all(r.correct for r in records)  # W's pick answers every question here, in either order
        assert sorted(asked) == sorted(ids)  # W is asked once per question, for the prompt and the parse
    with pytest.raises(ValueError, match="ordered by W's numbers"):
        ConductorArm("ranked", FirstShownPolicy(), ranked=True)
