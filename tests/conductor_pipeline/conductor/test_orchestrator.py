"""The orchestrator: access lists, recording, infrastructure failures, recursion, concurrency."""

from __future__ import annotations

import asyncio

import pytest

from conductor_pipeline.conductor.execution import one_step_workflow
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.conductor.protocols import PolicyOutput
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import CallStatus, Question, stable_id
from conductor_pipeline.warehouse import Warehouse
from tests.builders import SAMPLE_QUESTION, RecordingWorker, ScriptedPolicy, lists, make_pool, orchestrate, seat


def test_each_worker_sees_exactly_its_access_list_and_rows_are_recorded(tmp_path):
    pool = make_pool(seat("a"), seat("b"), seat("c"))
    workers = {n: RecordingWorker(n, answer=str(40 + i)) for i, n in enumerate(["a", "b", "c"])}
    warehouse = Warehouse(tmp_path / "w.duckdb")
    text = lists([0, 1, 2], ["Find six.", "Find seven.", "Multiply them."], [[], [], "all"])

    async def main():
        orch = orchestrate(pool, workers, warehouse)
        record = await orch.run_workflow_text(SAMPLE_QUESTION, text, conductor_name="cond", run_id="r1", arm="arm", repeat=0)
        await orch.flush()
        return record

    record = asyncio.run(main())
    (req_a,), (req_b,), (req_c,) = (workers[n].requests for n in "abc")
    assert [m.role for m in req_a.messages] == ["user"]
    assert "Find six." in req_a.messages[-1].content and SAMPLE_QUESTION.problem in req_a.messages[-1].content
    assert [m.role for m in req_b.messages] == ["user"]  # sees nothing earlier
    assert [(m.role, m.content) for m in req_c.messages[:4]] == [
        ("user", "Find six."), ("assistant", "a says \\boxed{40}"),
        ("user", "Find seven."), ("assistant", "b says \\boxed{41}"),
    ]
    assert req_c.messages[4].role == "user" and "Multiply them." in req_c.messages[4].content
    assert req_c.temperature == 0.2 and req_c.max_tokens == 4096
    # The final answer is the last step's: c answers 42.
    assert record.parse_code == "ok" and record.final_answer == "42" and record.correct is True
    assert record.workers == ["a", "b", "c"] and record.n_steps == 3 and not record.infra_failure
    assert record.cost_usd == pytest.approx(0.003) and record.latency_s == pytest.approx(1.5)

    calls = warehouse.query("SELECT call_id, kind, step, worker, correct FROM calls ORDER BY step")
    assert calls["call_id"].to_list() == [stable_id("step", record.workflow_id, i) for i in range(3)]
    assert set(calls["kind"]) == {"step"} and calls["correct"].to_list() == [False, False, True]
    rows = warehouse.query("SELECT parse_code, n_steps, workers, correct, arm FROM workflows")
    assert rows.row(0) == ("ok", 3, ["a", "b", "c"], True, "arm")


def test_a_subset_access_list_and_no_question_in_context():
    pool = make_pool(seat("a"), seat("b"), seat("c"))
    workers = {n: RecordingWorker(n) for n in "abc"}
    text = lists(["a", "b", "c"], ["one", "two", "three"], [[], [0], [1]])

    async def main():
        orch = orchestrate(pool, workers, include_question=False, naming="names")
        await orch.run_workflow_text(SAMPLE_QUESTION, text, conductor_name="cond", run_id="r", arm="x")

    asyncio.run(main())
    (req_c,) = workers["c"].requests
    assert [m.content for m in req_c.messages] == ["two", "b says \\boxed{42}", "three"]


def test_unparseable_output_is_recorded_as_a_wrong_workflow_with_its_code(tmp_path):
    pool = make_pool(seat("a"))
    warehouse = Warehouse(tmp_path / "w.duckdb")

    async def main():
        orch = orchestrate(pool, {"a": RecordingWorker("a")}, warehouse)
        output = PolicyOutput(text="I would ask Model 0.", prompt_tokens=3, completion_tokens=4, latency_s=0.2)
        record = await orch.run_workflow_text(
            SAMPLE_QUESTION, output.text, conductor_name="cond", run_id="r", arm="c", conductor_output=output
        )
        await orch.flush()
        return record

    record = asyncio.run(main())
    assert record.parse_code == "no_workflow" and record.correct is False and record.n_steps == 0
    kinds = warehouse.query("SELECT kind, completion_tokens FROM calls")
    assert kinds.rows() == [("conductor", 4)]


def test_a_step_that_stays_transient_makes_an_infrastructure_failure_not_a_wrong_answer(tmp_path):
    pool = make_pool(seat("a"), seat("b"))
    workers = {"a": RecordingWorker("a", status=CallStatus.TRANSIENT), "b": RecordingWorker("b")}
    warehouse = Warehouse(tmp_path / "w.duckdb")
    text = lists([0, 1], ["first", "second"], [[], "all"])

    async def main():
        orch = orchestrate(pool, workers, warehouse)
        record = await orch.run_workflow_text(SAMPLE_QUESTION, text, conductor_name="c", run_id="r", arm="c")
        await orch.flush()
        return record

    record = asyncio.run(main())
    assert record.infra_failure is True and record.correct is None
    assert workers["b"].requests == []  # the workflow stopped at the failed step
    assert warehouse.query("SELECT status, correct FROM calls").rows() == [("transient", None)]
    assert warehouse.query("SELECT infra_failure FROM workflows").item() is True


def test_not_recorded_replay_is_an_infrastructure_failure_but_terminal_is_scored():
    pool = make_pool(seat("a"), seat("b"))

    async def main(status):
        orch = orchestrate(pool, {"a": RecordingWorker("a", status=status), "b": RecordingWorker("b")})
        return await orch.execute(SAMPLE_QUESTION, one_step_workflow("a", SAMPLE_QUESTION), run_id="r", conductor_name="solo")

    assert asyncio.run(main(CallStatus.NOT_RECORDED)).infra_failure is True
    terminal = asyncio.run(main(CallStatus.TERMINAL))
    assert terminal.infra_failure is False and terminal.correct is False


def test_recursion_passes_the_answer_through_on_three_empty_lists(tmp_path):
    pool = make_pool(seat("a"), seat("self", backend="conductor"))
    policy = ScriptedPolicy(["model_id = []\nsubtasks = []\naccess_list = []"])
    warehouse = Warehouse(tmp_path / "w.duckdb")
    text = lists([0, 1], ["solve", "check the answer"], [[], "all"])

    async def main():
        orch = orchestrate(pool, {"a": RecordingWorker("a", answer="42")}, warehouse, conductor_policy=policy)
        record = await orch.run_workflow_text(SAMPLE_QUESTION, text, conductor_name="c", run_id="r", arm="c")
        await orch.flush()
        return record

    record = asyncio.run(main())
    assert len(policy.calls) == 1
    shown = "\n".join(m["content"] for m in policy.calls[0])
    assert "a says \\boxed{42}" in shown  # the answer so far reaches the inner conductor
    assert record.final_answer == "42" and record.correct is True and record.workers == ["a", "self"]
    kinds = warehouse.query("SELECT kind, count(*) FROM calls GROUP BY kind ORDER BY kind").rows()
    assert kinds == [("conductor", 1), ("step", 2)]
    # The inner conductor's reply is a workflow row of its own, linked to the calling step and the
    # top-level workflow; its call carries its id, the top-level steps carry the top-level id.
    inner = warehouse.query(
        "SELECT workflow_id, parent_workflow_id, parent_step, depth, root_workflow_id, n_steps, final_answer, correct "
        "FROM workflows WHERE parent_workflow_id IS NOT NULL"
    ).rows()
    assert len(inner) == 1
    inner_id = inner[0][0]
    assert inner[0][1:] == (record.workflow_id, 1, 1, record.workflow_id, 0, "42", True)
    by_workflow = warehouse.query(
        "SELECT kind, workflow_id, cost_usd FROM calls ORDER BY kind, step NULLS FIRST"
    ).rows()
    assert [(kind, wid) for kind, wid, _ in by_workflow] == [
        ("conductor", inner_id), ("step", record.workflow_id), ("step", record.workflow_id)
    ]
    assert by_workflow[-1][2] is None  # the conductor step's cost is carried by its inner calls
    roots = warehouse.query(
        "SELECT DISTINCT coalesce(w.root_workflow_id, c.workflow_id) FROM calls c JOIN workflows w USING (workflow_id)"
    ).rows()
    assert roots == [(record.workflow_id,)]


def test_recursion_executes_a_new_workflow_whose_answer_becomes_the_steps_answer():
    pool = make_pool(seat("a"), seat("b"), seat("self", backend="conductor"))
    policy = ScriptedPolicy([lists([1], ["redo it properly"], [[]])])
    workers = {"a": RecordingWorker("a", answer="7"), "b": RecordingWorker("b", answer="42")}

    async def main():
        orch = orchestrate(pool, workers, conductor_policy=policy)
        text = lists([0, 2], ["solve", "improve"], [[], "all"])
        return await orch.run_workflow_text(SAMPLE_QUESTION, text, conductor_name="c", run_id="r", arm="c")

    record = asyncio.run(main())
    assert [m.content for m in workers["b"].requests[0].messages][-1].endswith("redo it properly")
    assert record.final_answer == "42" and record.correct is True


def test_recursion_depth_is_capped():
    pool = make_pool(seat("a"), seat("self", backend="conductor"))
    # The conductor always asks for itself again: only the cap stops it.
    policy = ScriptedPolicy([lists([0, 1], ["solve", "again"], [[], "all"])])

    async def main(max_depth):
        policy.calls.clear()
        orch = orchestrate(pool, {"a": RecordingWorker("a")}, conductor_policy=policy, max_depth=max_depth)
        return await orch.run_workflow_text(SAMPLE_QUESTION, lists([1], ["start"], [[]]), conductor_name="c", run_id="r")

    record = asyncio.run(main(2))
    assert len(policy.calls) == 2 and record.correct is True
    asyncio.run(main(0))
    assert policy.calls == []


def test_a_pool_that_seats_the_conductor_needs_a_policy():
    pool = make_pool(seat("a"), seat("self", backend="conductor"))
    with pytest.raises(ValueError, match="recursion needs"):
        Orchestrator(pool, {"a": RecordingWorker("a")}, Governor.from_pool(pool), None)


def test_many_workflows_run_concurrently_within_the_seat_limit(tmp_path):
    pool = make_pool(seat("a", concurrency=3), seat("b", concurrency=8))
    # b is slower than a, so its calls pile up behind a's: its own limit (8), not a's (3), must bind.
    workers = {"a": RecordingWorker("a", delay_s=0.01), "b": RecordingWorker("b", delay_s=0.05)}
    warehouse = Warehouse(tmp_path / "w.duckdb")
    questions = [
        Question(question_id=f"q{i}", corpus="math", split="test", problem=f"p{i}", answer="42") for i in range(40)
    ]

    async def main():
        orch = orchestrate(pool, workers, warehouse, flush_every_rows=25)
        text = lists([0, 1], ["x", "y"], [[], "all"])
        records = await asyncio.gather(
            *(orch.run_workflow_text(q, text, conductor_name="c", run_id="r", arm="c") for q in questions)
        )
        await orch.flush()
        return records

    records = asyncio.run(main())
    assert all(r.correct for r in records)
    assert 1 < workers["a"].peak_in_flight <= 3
    assert workers["b"].peak_in_flight > 3
    assert warehouse.query("SELECT count(*) FROM workflows").item() == 40
    assert warehouse.query("SELECT count(*) FROM calls").item() == 80


def test_a_flush_holds_back_the_calls_of_a_workflow_still_running(tmp_path):
    """A flush while another workflow is mid-way (its first step done, its second waiting) writes
    the finished workflows with their calls and none of the running one's: killed there, a rerun
    runs it again under the same call keys, and a first attempt's rows would win over the rerun's."""
    pool = make_pool(seat("a"), seat("b"))
    release = asyncio.Event()

    class WaitingWorker(RecordingWorker):
        async def call(self, request):
            if request.question.question_id == "q0":
                await release.wait()
            return await super().call(request)

    workers = {"a": RecordingWorker("a"), "b": WaitingWorker("b")}
    warehouse = Warehouse(tmp_path / "w.duckdb")
    questions = [Question(question_id=f"q{i}", corpus="math", split="test", problem=f"p{i}", answer="42") for i in range(4)]
    orphans = ("SELECT count(*) FROM calls c WHERE NOT EXISTS "
               "(SELECT 1 FROM workflows w WHERE w.workflow_id = c.workflow_id)")

    async def main():
        orch = orchestrate(pool, workers, warehouse, flush_every_rows=2)
        text = lists([0, 1], ["x", "y"], [[], "all"])
        running = asyncio.ensure_future(orch.run_workflow_text(questions[0], text, conductor_name="c", run_id="r", arm="c"))
        for question in questions[1:]:
            await orch.run_workflow_text(question, text, conductor_name="c", run_id="r", arm="c")
        await orch.flush()
        mid_way = (warehouse.query("SELECT count(*) FROM workflows").item(), warehouse.query(orphans).item())
        release.set()
        await running
        await orch.flush()
        return mid_way

    assert asyncio.run(main()) == (3, 0)  # q0's step "a" is done but not written
    assert warehouse.query("SELECT count(*) FROM workflows").item() == 4
    assert warehouse.query("SELECT count(*) FROM calls").item() == 8
    assert warehouse.query(orphans).item() == 0


def test_score_completion_records_nothing_and_reports_the_parse_code(tmp_path):
    pool = make_pool(seat("a"))
    warehouse = Warehouse(tmp_path / "w.duckdb")

    async def main():
        orch = orchestrate(pool, {"a": RecordingWorker("a")}, warehouse)
        good = await orch.score_completion(SAMPLE_QUESTION, lists([0], ["solve"], [[]]))
        bad = await orch.score_completion(SAMPLE_QUESTION, "model_id = [0]\nsubtasks = []\naccess_list = [[]]")
        await orch.flush()
        return good, bad

    good, bad = asyncio.run(main())
    assert good == ("ok", True, "a")
    assert bad == ("length_mismatch", None, None)
    assert warehouse.query("SELECT count(*) FROM calls").item() == 0


def test_score_completion_maps_a_shown_subset_of_the_pool_back_to_real_names():
    pool = make_pool(seat("a"), seat("b"), seat("c"))
    workers = {"a": RecordingWorker("a", answer="1"), "b": RecordingWorker("b", answer="1"),
               "c": RecordingWorker("c", answer="42")}

    async def main():
        orch = orchestrate(pool, workers)
        # The prompt showed only c then a: "Model 0" is c.
        return await orch.score_completion(SAMPLE_QUESTION, lists([0], ["solve"], [[]]), shown_workers=["c", "a"])

    assert asyncio.run(main()) == ("ok", True, "c")
    assert len(workers["c"].requests) == 1 and workers["a"].requests == []


def test_unknown_latency_stays_unknown():
    """Replay records no latency: a workflow of such steps has latency None, not 0 s."""
    from conductor_pipeline.conductor.execution import add_latency

    assert add_latency(None, None) is None
    assert add_latency(None, 1.5) == 1.5
    assert add_latency(2.0, None) == 2.0
    assert add_latency(2.0, 0.5) == 2.5
