"""The governor's limits hold under real concurrent HTTP load, and rate budgets make callers wait."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.fakes import FaultKind, FaultRates, FaultServer
from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker, shared_http_client
from conductor_pipeline.pools.config import PoolConfig, RetryConfig
from conductor_pipeline.pools.governor import Governor, TokenBucket
from conductor_pipeline.records import CallStatus
from tests.builders import make_request, make_seat


def test_global_and_per_worker_limits_hold_at_the_server() -> None:
    """200 calls over two seats; the server, not the governor, measures what was in flight."""
    faults = FaultRates.spread(0.2, [FaultKind.RATE_LIMIT, FaultKind.SERVER_ERROR, FaultKind.RESET])

    async def run(srv: FaultServer) -> tuple[Governor, list]:
        governor = Governor(max_in_flight=8, per_worker={"narrow": 3, "wide": 8})
        client = shared_http_client(16)
        retry = RetryConfig(max_attempts=6, base_delay_s=0.005, max_delay_s=0.5)
        workers = {
            name: OpenAICompatWorker(make_seat(srv.base_url, name=name, model=f"model-{name}"), retry, client=client)
            for name in ("narrow", "wide")
        }

        async def one(i: int):
            name = "narrow" if i % 2 else "wide"
            async with governor.slot(name):
                return await workers[name].call(make_request(i))

        results = await asyncio.gather(*(one(i) for i in range(200)))
        await client.aclose()
        return governor, results

    with FaultServer(latency_s=0.02, faults=faults, retry_after_s=0.0, seed=3) as srv:
        governor, results = asyncio.run(run(srv))
        stats = srv.stats()
    assert len(results) == 200
    assert stats.served["rate_limit"] + stats.served["server_error"] + stats.served["reset"] > 0
    assert stats.peak_in_flight <= 8
    assert stats.peak_in_flight_by_model["model-narrow"] <= 3
    assert stats.peak_in_flight_by_model["model-wide"] <= 8
    assert governor.stats.peak_in_flight == 8  # 200 callers at once do fill the pool
    assert governor.stats.per_worker_peak["narrow"] == 3
    assert governor.stats.in_flight == 0 and governor.stats.slots_granted == 200
    assert governor.stats.waits > 0


def test_unknown_worker_is_refused() -> None:
    async def run() -> None:
        governor = Governor(max_in_flight=2, per_worker={"a": 1})
        async with governor.slot("b"):
            pass

    with pytest.raises(KeyError, match="'b'"):
        asyncio.run(run())


def test_requests_per_minute_makes_callers_wait() -> None:
    """1,200 RPM with a bucket of one request: six calls need five refills of 50 ms each."""

    async def run() -> tuple[Governor, float]:
        governor = Governor(max_in_flight=10, per_worker={"a": 10}, requests_per_minute=1200, rate_burst_s=0.05)
        t0 = time.perf_counter()

        async def one() -> None:
            async with governor.slot("a"):
                pass

        await asyncio.gather(*(one() for _ in range(6)))
        return governor, time.perf_counter() - t0

    governor, elapsed = asyncio.run(run())
    assert governor.stats.rate_waits == 5
    assert elapsed >= 0.2  # a lower bound: the budget was enforced, not a speed claim


def test_tokens_per_minute_settles_with_reported_usage() -> None:
    async def run() -> float:
        bucket_owner = Governor(max_in_flight=4, per_worker={"a": 4}, tokens_per_minute=60_000, rate_burst_s=1.0)
        async with bucket_owner.slot("a", est_tokens=800) as lease:
            lease.report_tokens(300)  # the call used less than estimated: 500 tokens come back
        bucket = bucket_owner._tokens_bucket
        assert bucket is not None
        return bucket._level

    level = asyncio.run(run())
    assert 700 - 1 <= level <= 1000  # capacity 1,000; 300 spent (plus a sliver refilled)


def test_token_bucket_oversized_request_goes_into_debt_rather_than_blocking() -> None:
    async def run() -> float:
        bucket = TokenBucket(6000, burst_s=1.0)  # capacity 100
        return await bucket.take(250)

    assert asyncio.run(run()) == 0.0  # a full bucket lets it through at once


def test_from_pool_uses_seat_concurrency_and_pool_limits() -> None:
    pool = PoolConfig.model_validate({
        "name": "p",
        "governor": {"max_in_flight": 5, "requests_per_minute": 100},
        "workers": [
            make_seat("http://127.0.0.1:1/v1", name="a", concurrency=2).model_dump(),
            make_seat("http://127.0.0.1:1/v1", name="b", concurrency=7).model_dump(),
        ],
    })
    governor = Governor.from_pool(pool)
    assert governor.max_in_flight == 5
    assert governor.per_worker_limits == {"a": 2, "b": 7}
    assert governor._requests_bucket is not None and governor._tokens_bucket is None


def test_transient_results_hold_their_slot_only_while_running() -> None:
    """A call that exhausts its retries still releases its slot (nothing leaks on failure)."""

    async def run(srv: FaultServer) -> tuple[Governor, CallStatus]:
        governor = Governor(max_in_flight=1, per_worker={"w0": 1})
        worker = OpenAICompatWorker(make_seat(srv.base_url), RetryConfig(max_attempts=2, base_delay_s=0.0))
        async with governor.slot("w0"):
            result = await worker.call(make_request())
        await worker.aclose()
        return governor, result.status

    with FaultServer(faults=FaultRates(server_error=1.0)) as srv:
        governor, status = asyncio.run(run(srv))
    assert status is CallStatus.TRANSIENT
    assert governor.stats.in_flight == 0
