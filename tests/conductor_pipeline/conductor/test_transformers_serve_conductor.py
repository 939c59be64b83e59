"""An OpenAI-endpoint conductor against a real `transformers serve` server on 127.0.0.1, serving
the tiny offline model. Its random weights write no valid workflow, and the pipeline must say so
(a named parse code, scored wrong, not an infrastructure failure) while recording the server's
own token usage for every conductor call."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conductor_pipeline.conductor.endpoint_policy import OpenAIEndpointPolicy
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.evaluation.arms import ConductorArm, run_arm
from conductor_pipeline.pools.backends.transformers_serve import TransformersServer
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import Question
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.workflow import PARSE_CODES


class NeverCalled:
    """A Worker that fails the test if a step ever reaches it."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def call(self, request):
        raise AssertionError(f"worker {self.name} called although no workflow parsed")

    async def aclose(self) -> None:
        return None


def test_endpoint_conductor_on_transformers_serve_is_recorded_with_its_parse_code(
    served_tiny_model: TransformersServer, tmp_path: Path
) -> None:
    pool = PoolConfig(
        name="served-conductor",
        workers=[WorkerSeat(name=n, backend="replay", replay_source="zeroeval", model=n, description=f"worker {n}")
                 for n in ("a", "b")],
    )
    questions = [
        Question(question_id=f"q{i}", corpus="math", split="test", problem=f"What is {i} + {i}?", answer=str(2 * i))
        for i in range(2)
    ]
    warehouse = Warehouse(tmp_path / "w.duckdb")

    async def main():
        policy = OpenAIEndpointPolicy(served_tiny_model.base_url, served_tiny_model.model_id)
        workers = {"a": NeverCalled("a"), "b": NeverCalled("b")}
        orchestrator = Orchestrator(pool, workers, Governor.from_pool(pool), warehouse)
        try:
            return await run_arm(
                orchestrator, ConductorArm("served", policy, max_new_tokens=32, examples=()), questions,
                run_id="eval-served-tiny",
            )
        finally:
            await policy.aclose()

    records = asyncio.run(main())
    assert len(records) == 2
    for record in records:
        assert record.parse_code in PARSE_CODES and record.parse_code != "ok"
        assert record.correct is False and record.infra_failure is False
    calls = warehouse.query("SELECT kind, prompt_tokens, completion_tokens, response FROM calls")
    assert calls["kind"].to_list() == ["conductor", "conductor"]
    assert all(p > 0 for p in calls["prompt_tokens"]) and all(0 < c <= 32 for c in calls["completion_tokens"])
