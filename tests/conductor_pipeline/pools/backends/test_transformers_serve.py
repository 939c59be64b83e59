"""Real calls through OpenAICompatWorker to `transformers serve` running a tiny model built offline.

The model has random weights, so its text is noise; what is checked is the client path against
a real server: statuses, usage tokens from the server, the seat's max_tokens floor, and a
terminal 4xx when the request names a model the server does not serve.
"""

from __future__ import annotations

import asyncio

from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker, shared_http_client
from conductor_pipeline.pools.backends.transformers_serve import TransformersServer
from conductor_pipeline.pools.config import PoolConfig, load_pool
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import CallResult, CallStatus
from tests.builders import make_request


def bound_pool(server: TransformersServer) -> PoolConfig:
    pool = load_pool("tiny-serve")
    return pool.model_copy(update={"workers": [server.bind_seat(seat) for seat in pool.workers]})


def run_calls(pool: PoolConfig, plan: list[tuple[str, int | None]]) -> list[CallResult]:
    async def run() -> list[CallResult]:
        governor = Governor.from_pool(pool)
        client = shared_http_client(pool.governor.max_in_flight)
        workers = {seat.name: OpenAICompatWorker(seat, pool.retry, client=client) for seat in pool.workers}

        async def one(index: int, name: str, max_tokens: int | None) -> CallResult:
            async with governor.slot(name):
                return await workers[name].call(make_request(index, max_tokens=max_tokens))

        try:
            return await asyncio.gather(*(one(i, name, cap) for i, (name, cap) in enumerate(plan)))
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_real_calls_record_status_and_usage(served_tiny_model: TransformersServer) -> None:
    pool = bound_pool(served_tiny_model)
    plan = [("tiny-short", None), ("tiny-long", 4), ("tiny-short", 8), ("tiny-long", None)]
    results = run_calls(pool, plan)
    for (name, _), result in zip(plan, results):
        seat = pool.seat(name)
        assert result.status in (CallStatus.OK, CallStatus.TRUNCATED), result.error
        assert result.finish_reason in ("stop", "length")
        assert (result.status is CallStatus.TRUNCATED) == (result.finish_reason == "length")
        assert result.prompt_tokens > 0 and 0 < result.completion_tokens <= seat.max_tokens
        if result.status is CallStatus.TRUNCATED:
            assert result.completion_tokens == seat.max_tokens  # the floor, not the smaller request cap
        assert result.cost_usd == 0.0 and result.attempts == 1 and result.latency_s > 0


def test_a_model_the_server_does_not_serve_is_terminal(served_tiny_model: TransformersServer) -> None:
    pool = bound_pool(served_tiny_model)
    wrong = pool.model_copy(update={"workers": [pool.workers[0].model_copy(update={"model": "not-this-model"})]})
    (result,) = run_calls(wrong, [("tiny-short", None)])
    assert result.status is CallStatus.TERMINAL
    assert "HTTP 4" in result.error and result.attempts == 1
