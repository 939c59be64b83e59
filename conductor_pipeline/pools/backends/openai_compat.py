"""The `openai` backend: any OpenAI-compatible /v1/chat/completions endpoint over one httpx client.

vLLM, SGLang, `transformers serve` and hosted providers all speak this protocol, so one small
client covers them. It does three things the generic SDK does not do for us:

- classifies every call into exactly one `CallStatus` and never raises for provider faults, so
  a probe of thousands of calls accounts for each one;
- retries transient faults (429, 408, 5xx, timeouts, connection errors, malformed 2xx bodies)
  with exponential backoff and full jitter, honouring `retry-after-ms` / `Retry-After`, inside
  the pool's `RetryConfig` budget; what still fails is returned as `transient` (never scored);
- applies the seat's `max_tokens` floor, because a generic low cap truncates reasoning models
  mid-thought and looks like incompetence.

Decisions worth knowing:
- A 2xx whose body is not the expected JSON is `transient`, not `terminal`: it is an
  infrastructure glitch (a proxy's HTML page, a cut-off body), not the model's answer, and
  scoring it would charge the worker for the network.
- 408 (request timeout) is transient like a client-side timeout; every other 4xx is terminal.
- A `Retry-After` longer than `RetryConfig.max_delay_s` ends the retries at once (status
  transient): waiting hours inside one call would stall a probe, hammering early is rude.
- `latency_s` spans the whole call, retries and backoff included: it is what a workflow waits.
- The API key is read once from the variable the seat names, sent only as a bearer header,
  and scrubbed from any error text; no header ever reaches a log line or a `CallResult`.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime

import httpx

from conductor_pipeline.pools.config import MissingApiKeyError, RetryConfig, WorkerSeat
from conductor_pipeline.records import CallRequest, CallResult, CallStatus

logger = logging.getLogger(__name__)

# HTTP statuses worth another attempt: rate limits, request timeouts and server-side failures.
TRANSIENT_HTTP_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))
# How much of an error body goes into `CallResult.error`: enough to diagnose, bounded for the warehouse.
MAX_ERROR_CHARS = 300
# Connection-pool headroom when a worker builds its own client (a shared pool client is preferred).
DEFAULT_MAX_CONNECTIONS = 256


# Connections per transport shard (see `ShardedTransport`): httpcore 1.x re-scans its whole pool
# once per idle connection on every request (O(n^2) in pool size), so the pool is split into
# shards this small and the scan stays cheap.
CONNECTIONS_PER_SHARD = 4


class _CountedStream(httpx.AsyncByteStream):
    """A response body that tells its shard when it is closed (the connection is free again)."""

    def __init__(self, inner: httpx.AsyncByteStream, on_close: Callable[[], None]) -> None:
        self._inner = inner
        self._on_close: Callable[[], None] | None = on_close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._on_close is not None:
                self._on_close()
                self._on_close = None


class ShardedTransport(httpx.AsyncBaseTransport):
    """One logical connection pool made of small httpx pools; each request goes to the least busy.

    It exists only to sidestep httpcore 1.x's quadratic pool bookkeeping at high concurrency;
    behaviour is otherwise that of one `httpx.AsyncHTTPTransport` with `max_connections` connections.
    """

    def __init__(self, max_connections: int, per_shard: int = CONNECTIONS_PER_SHARD) -> None:
        n_shards = max(1, -(-max_connections // per_shard))
        sizes = [max_connections // n_shards + (i < max_connections % n_shards) for i in range(n_shards)]
        tls = httpx.create_ssl_context()  # one context for all shards: each costs ~40 ms to build
        self._shards = [
            httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=n, max_keepalive_connections=n), verify=tls)
            for n in sizes
        ]
        self._busy = [0] * n_shards

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        index = min(range(len(self._shards)), key=self._busy.__getitem__)
        self._busy[index] += 1

        def release() -> None:
            self._busy[index] -= 1

        try:
            response = await self._shards[index].handle_async_request(request)
        except BaseException:
            release()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _CountedStream(response.stream, release)
        return response

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()


def shared_http_client(max_connections: int = DEFAULT_MAX_CONNECTIONS) -> httpx.AsyncClient:
    """The one async client a pool's workers share, with keep-alive for `max_connections` connections.

    Size it to the pool's in-flight limit: idle connections beyond httpx's default of 20 would
    otherwise be closed and reopened on every request. Timeouts are set per request from each
    seat's `timeout_s`.
    """
    return httpx.AsyncClient(transport=ShardedTransport(max_connections), timeout=None)


def parse_retry_after(headers: httpx.Headers, *, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms`, else `Retry-After` (seconds or HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(attempt: int, retry: RetryConfig, rng: random.Random) -> float:
    """Full-jitter exponential backoff before attempt `attempt + 1` (AWS architecture blog, 2015)."""
    ceiling = min(retry.max_delay_s, retry.base_delay_s * 2 ** (attempt - 1))
    return rng.uniform(0.0, ceiling)


class _Transient(Exception):
    """One failed attempt that may succeed if repeated."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OpenAICompatWorker:
    """A pool seat served by an OpenAI-compatible chat-completions endpoint.

    Pass the pool's shared client (`shared_http_client`) so all seats reuse one connection pool;
    without one the worker builds and owns its own and closes it in `aclose`.
    """

    def __init__(
        self,
        seat: WorkerSeat,
        retry: RetryConfig,
        *,
        client: httpx.AsyncClient | None = None,
        environ: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not seat.endpoint:
            hint = " (a vllm seat gets one from VllmLauncherResource.launch())" if seat.is_vllm else ""
            raise ValueError(f"worker {seat.name!r} has no endpoint{hint}")
        self.name = seat.name
        self.seat = seat
        self.retry = retry
        self._url = seat.endpoint.rstrip("/") + "/chat/completions"
        self._owns_client = client is None
        self._client = client if client is not None else shared_http_client()
        self._timeout = httpx.Timeout(seat.timeout_s)
        self._rng = rng or random.Random()
        env = os.environ if environ is None else environ
        self._api_key: str | None = None
        self._headers: dict[str, str] = {}
        if seat.api_key_env:
            key = env.get(seat.api_key_env)
            if not key:
                raise MissingApiKeyError(f"worker {seat.name!r} needs environment variable {seat.api_key_env}")
            self._api_key = key
            self._headers["Authorization"] = f"Bearer {key}"

    def __repr__(self) -> str:  # never show the key, even in a debugger or a traceback
        return f"OpenAICompatWorker(name={self.name!r}, model={self.seat.model!r}, endpoint={self.seat.endpoint!r})"

    def request_body(self, request: CallRequest) -> dict:
        """The chat-completions payload; max_tokens never goes below the seat's floor."""
        return {
            "model": self.seat.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "max_tokens": max(request.max_tokens or 0, self.seat.max_tokens),
            "temperature": request.temperature,
        }

    async def call(self, request: CallRequest) -> CallResult:
        """One call with retries; always returns a classified result for provider faults."""
        body = self.request_body(request)
        started_at = datetime.now(UTC)
        t0 = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            try:
                result = await self._attempt(body)
            except _Transient as fault:
                error = self._scrub(str(fault))
                delay = backoff_delay(attempt, self.retry, self._rng)
                if fault.retry_after_s is not None:
                    if fault.retry_after_s > self.retry.max_delay_s:
                        error += f" (Retry-After {fault.retry_after_s:.0f}s exceeds the retry budget)"
                        attempt_budget_left = False
                    else:
                        delay = max(delay, fault.retry_after_s)
                        attempt_budget_left = attempt < self.retry.max_attempts
                else:
                    attempt_budget_left = attempt < self.retry.max_attempts
                if not attempt_budget_left:
                    logger.warning("worker %s: giving up after %d attempts: %s", self.name, attempt, error)
                    return CallResult(
                        status=CallStatus.TRANSIENT, error=error, attempts=attempt, started_at=started_at,
                        latency_s=time.perf_counter() - t0,
                    )
                logger.info("worker %s: attempt %d failed (%s); retrying in %.2fs", self.name, attempt, error, delay)
                await asyncio.sleep(delay)
                continue
            result.attempts = attempt
            result.started_at = started_at
            result.latency_s = time.perf_counter() - t0
            return result

    async def _attempt(self, body: dict) -> CallResult:
        """One HTTP round trip: a final result, or `_Transient` to try again."""
        try:
            response = await self._client.post(self._url, json=body, headers=self._headers, timeout=self._timeout)
        except httpx.TimeoutException as exc:
            raise _Transient(f"timeout after {self.seat.timeout_s}s ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise _Transient(f"connection error ({type(exc).__name__}: {exc})") from None
        if response.status_code in TRANSIENT_HTTP_STATUSES:
            raise _Transient(
                f"HTTP {response.status_code}: {response.text[:MAX_ERROR_CHARS]}", parse_retry_after(response.headers)
            )
        if response.status_code >= 400:
            return CallResult(
                status=CallStatus.TERMINAL,
                error=self._scrub(f"HTTP {response.status_code}: {response.text[:MAX_ERROR_CHARS]}"),
            )
        try:
            return self._parse_completion(response.json())
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise _Transient(f"malformed response body ({type(exc).__name__}): {response.text[:80]!r}") from None

    def _parse_completion(self, payload: dict) -> CallResult:
        choice = payload["choices"][0]
        message = choice.get("message") or {}
        content = message.get("content")
        finish_reason = choice.get("finish_reason")
        usage = payload.get("usage") or {}
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        details = usage.get("completion_tokens_details") or {}
        reasoning_tokens = details.get("reasoning_tokens")
        if finish_reason == "length":
            status = CallStatus.TRUNCATED
        elif not (content or "").strip():
            status = CallStatus.EMPTY
        else:
            status = CallStatus.OK
        return CallResult(
            status=status,
            response=content,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            reasoning_tokens=reasoning_tokens,
            cost_usd=self.seat.cost_usd(prompt_tokens, completion_tokens) if usage else None,
        )

    def _scrub(self, text: str) -> str:
        """Remove the key from server-provided text (some gateways echo what they were sent)."""
        if self._api_key and self._api_key in text:
            text = text.replace(self._api_key, "[redacted]")
        return text

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
