"""OpenAICompatWorker against a real fault-injecting server: one test per status and retry rule."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import httpx
import pytest

from tests.fakes import FaultServer
from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker, parse_retry_after, shared_http_client
from conductor_pipeline.pools.config import MissingApiKeyError, RetryConfig
from conductor_pipeline.records import CallResult, CallStatus
from tests.builders import KEY_ENV, TEST_API_KEY, make_request, make_seat

FAST_RETRY = RetryConfig(max_attempts=4, base_delay_s=0.01, max_delay_s=1.0)


def call_once(server: FaultServer, *, retry: RetryConfig = FAST_RETRY, max_tokens: int | None = None,
              **seat_overrides: object) -> CallResult:
    async def run() -> CallResult:
        seat = make_seat(server.base_url, api_key_env=KEY_ENV, **seat_overrides)
        worker = OpenAICompatWorker(seat, retry, environ={KEY_ENV: TEST_API_KEY})
        try:
            return await worker.call(make_request(max_tokens=max_tokens))
        finally:
            await worker.aclose()

    return asyncio.run(run())


def test_ok_records_usage_cost_and_timing(server: FaultServer) -> None:
    result = call_once(server)
    assert result.status is CallStatus.OK
    assert "\\boxed{42}" in result.response
    assert result.finish_reason == "stop"
    assert result.prompt_tokens > 0 and result.completion_tokens > 0
    assert result.reasoning_tokens == 0
    seat = make_seat(server.base_url)
    assert result.cost_usd == pytest.approx(seat.cost_usd(result.prompt_tokens, result.completion_tokens))
    assert result.attempts == 1 and result.latency_s > 0 and result.started_at is not None
    assert server.stats().served["ok"] == 1


def test_finish_reason_length_is_truncated(server: FaultServer) -> None:
    server.queue("truncated")
    result = call_once(server)
    assert result.status is CallStatus.TRUNCATED
    assert result.finish_reason == "length"
    assert result.response  # the partial text is kept for inspection
    assert result.attempts == 1


def test_reasoning_only_is_empty_with_reasoning_tokens(server: FaultServer) -> None:
    server.queue("reasoning_only")
    result = call_once(server)
    assert result.status is CallStatus.EMPTY
    assert result.response is None
    assert result.reasoning_tokens > 0


@pytest.mark.parametrize("fault", ["server_error", "reset", "hang", "rate_limit", "malformed"])
def test_each_transient_fault_is_retried_until_ok(server: FaultServer, fault: str) -> None:
    server.configure(retry_after_s=0.0)
    server.queue(fault)
    result = call_once(server, timeout_s=0.5)
    assert result.status is CallStatus.OK
    assert result.attempts == 2
    stats = server.stats()
    assert stats.served[fault] == 1 and stats.served["ok"] == 1


def test_persistent_transient_faults_end_as_transient_and_stop_at_the_budget(server: FaultServer) -> None:
    server.queue("server_error", "reset", "server_error", "server_error", "ok")
    result = call_once(server, retry=RetryConfig(max_attempts=4, base_delay_s=0.01, max_delay_s=1.0))
    assert result.status is CallStatus.TRANSIENT
    assert not result.status.scored
    assert result.attempts == 4
    assert "HTTP 500" in result.error
    assert result.response is None and result.latency_s > 0
    assert server.stats().total_requests == 4  # the queued fifth (ok) was never requested


def test_other_4xx_is_terminal_without_retry(server: FaultServer) -> None:
    server.queue("bad_request", "ok")
    result = call_once(server)
    assert result.status is CallStatus.TERMINAL
    assert result.status.scored
    assert result.attempts == 1
    assert "HTTP 400" in result.error
    assert server.stats().total_requests == 1


def test_retry_after_is_honoured(server: FaultServer) -> None:
    server.configure(retry_after_s=0.4)
    server.queue("rate_limit")
    result = call_once(server, retry=RetryConfig(max_attempts=3, base_delay_s=0.001, max_delay_s=5.0))
    assert result.status is CallStatus.OK and result.attempts == 2
    first, second = server.stats().log
    assert first["kind"] == "rate_limit"
    assert second["t"] - first["t"] >= 0.4  # backoff alone (<= 1 ms) would have retried at once


def test_retry_after_beyond_the_budget_gives_up_at_once(server: FaultServer) -> None:
    server.configure(retry_after_s=30.0)
    server.queue("rate_limit")
    result = call_once(server, retry=RetryConfig(max_attempts=5, base_delay_s=0.01, max_delay_s=2.0))
    assert result.status is CallStatus.TRANSIENT
    assert result.attempts == 1
    assert "exceeds the retry budget" in result.error


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "250", "retry-after": "3"})) == 0.25
    assert parse_retry_after(httpx.Headers({"retry-after": "3"})) == 3.0
    assert parse_retry_after(httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}), now=1445412480) == 10
    assert parse_retry_after(httpx.Headers({"retry-after": "soon"})) is None
    assert parse_retry_after(httpx.Headers({})) is None


def test_max_tokens_floor_is_applied(server: FaultServer) -> None:
    call_once(server, max_tokens=None)
    call_once(server, max_tokens=100)
    call_once(server, max_tokens=5000)
    sent = [entry["max_tokens"] for entry in server.stats().log]
    assert sent == [1024, 1024, 5000]  # the seat's floor is 1024


def test_api_key_is_sent_as_bearer_and_never_leaks(server: FaultServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # httpx, httpcore and our logger at their most verbose
    server.configure(retry_after_s=0.0)
    server.queue("server_error", "ok", "bad_request", "rate_limit", "rate_limit")
    results = [call_once(server) for _ in range(3)]
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.TERMINAL, CallStatus.OK]
    stats = server.stats()
    assert stats.auth_ok == stats.total_requests == 6 and stats.unauthorized == 0
    for result in results:
        assert TEST_API_KEY not in repr(dataclasses.asdict(result))
    assert caplog.records, "the retries should have logged something"
    assert TEST_API_KEY not in caplog.text
    assert all(TEST_API_KEY not in str(record.__dict__) for record in caplog.records)


def test_wrong_key_is_terminal_and_the_error_does_not_echo_it(server: FaultServer) -> None:
    async def run() -> CallResult:
        seat = make_seat(server.base_url, api_key_env=KEY_ENV)
        worker = OpenAICompatWorker(seat, FAST_RETRY, environ={KEY_ENV: "sk-wrong-key-123"})
        assert "sk-wrong-key-123" not in repr(worker)
        try:
            return await worker.call(make_request())
        finally:
            await worker.aclose()

    result = asyncio.run(run())
    assert result.status is CallStatus.TERMINAL and "HTTP 401" in result.error
    assert "sk-wrong-key-123" not in repr(dataclasses.asdict(result))


def test_missing_key_variable_fails_before_any_call_naming_the_worker(server: FaultServer) -> None:
    seat = make_seat(server.base_url, name="hosted-a", api_key_env="SOME_UNSET_KEY_VAR")
    with pytest.raises(MissingApiKeyError, match="hosted-a.*SOME_UNSET_KEY_VAR"):
        OpenAICompatWorker(seat, FAST_RETRY, environ={})
    assert server.stats().total_requests == 0


def test_shared_client_caps_connections_and_releases_them(server: FaultServer) -> None:
    """The sharded pool behaves like one pool of `max_connections`: never more in flight."""
    server.configure(latency_s=0.02)

    async def run() -> tuple[list[CallResult], list[int]]:
        client = shared_http_client(20)
        worker = OpenAICompatWorker(make_seat(server.base_url, api_key_env=KEY_ENV), FAST_RETRY, client=client,
                                    environ={KEY_ENV: TEST_API_KEY})
        results = await asyncio.gather(*(worker.call(make_request(i)) for i in range(80)))
        busy = list(client._transport._busy)
        await client.aclose()
        return results, busy

    results, busy = asyncio.run(run())
    assert all(r.status is CallStatus.OK for r in results)
    assert busy == [0] * 5  # 20 connections: five shards of four, all released
    assert server.stats().peak_in_flight <= 20
