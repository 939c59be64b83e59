"""A prompted conductor behind a real OpenAI-compatible server writes workflows that the
orchestrator runs on workers behind another real server (both the project's fault server on
127.0.0.1), with transient worker faults retried and never scored."""

from __future__ import annotations

import asyncio

from conductor_pipeline.conductor.endpoint_policy import OpenAIEndpointPolicy
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.evaluation.arms import ConductorArm, run_arm
from tests.fakes.fault_server import FaultServer
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import PoolConfig, RetryConfig, WorkerSeat
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import Question
from conductor_pipeline.warehouse import Warehouse

# The conductor server boxes this "answer": a two-step workflow in the paper's three-list form.
WORKFLOW = 'model_id = [0, 1]\nsubtasks = ["Compute the product.", "Check the product."]\naccess_list = [[], "all"]'


def test_endpoint_conductor_workflows_run_on_served_workers(tmp_path):
    questions = [
        Question(question_id=f"q{i}", corpus="math", split="test", problem=f"What is 6*7 ({i})?", answer="42")
        for i in range(4)
    ]
    with FaultServer(answer=WORKFLOW) as conductor_server, FaultServer(answer="42", retry_after_s=0.01) as workers_server:
        seats = [
            WorkerSeat(name=name, backend="openai", model="fault-server", endpoint=workers_server.base_url,
                       description=f"served worker {name}", max_tokens=256, timeout_s=5.0)
            for name in ("left", "right")
        ]
        pool = PoolConfig(
            name="served", workers=seats, retry=RetryConfig(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05)
        )
        # The first two worker requests fail transiently (503, then 429): retried, never scored.
        workers_server.queue("server_error", "rate_limit")
        warehouse = Warehouse(tmp_path / "w.duckdb")

        async def main():
            workers = build_workers(pool)
            policy = OpenAIEndpointPolicy(conductor_server.base_url, "fault-server", backoff_s=0.01)
            orchestrator = Orchestrator(pool, workers, Governor.from_pool(pool), warehouse)
            try:
                return await run_arm(
                    orchestrator, ConductorArm("endpoint", policy, max_new_tokens=256), questions, run_id="eval-served"
                )
            finally:
                await policy.aclose()
                for worker in workers.values():
                    await worker.aclose()

        records = asyncio.run(main())
        conductor_stats = conductor_server.stats()
        worker_stats = workers_server.stats()

    assert len(records) == 4
    assert all(r.parse_code == "ok" and r.workers == ["left", "right"] and r.correct for r in records)
    assert not any(r.infra_failure for r in records)
    assert conductor_stats.total_requests == 4
    assert worker_stats.total_requests == 4 * 2 + 2  # two retried faults
    calls = warehouse.query("SELECT kind, count(*) AS n, sum(attempts) AS attempts FROM calls GROUP BY kind ORDER BY kind")
    assert calls.rows() == [("conductor", 4, 4), ("step", 8, 10)]
    assert warehouse.query("SELECT count(*) FROM workflows WHERE correct").item() == 4
