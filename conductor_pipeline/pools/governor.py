"""The concurrency governor: how many calls may be in flight, per pool and per seat, and how fast.

Probes and workflow steps run as many concurrent coroutines; the governor is the one place
that decides when each may go. Callers `await` a slot (asyncio semaphores and one computed
sleep per rate-limit deficit, never a polling loop), so a pool never exceeds its providers'
concurrency or its requests/tokens-per-minute budgets however many callers there are.

One governor belongs to one event loop: asyncio primitives bind to the loop that first
waits on them, so build a governor inside the coroutine (or `asyncio.run`) that uses it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from conductor_pipeline.pools.config import PoolConfig
from conductor_pipeline.records import ChatMessage

# A rate bucket holds at most this many seconds of its per-minute budget. Providers meter per
# minute, so a full minute's allowance may go at once; the in-flight limits bound the burst anyway.
BUCKET_BURST_S = 60.0
# Rough characters per token of English/LaTeX text under BPE tokenizers: close enough for a rate
# budget settled with the real usage afterwards, and for replay's usage estimates.
CHARS_PER_TOKEN = 4


def estimate_call_tokens(messages: Iterable[ChatMessage], completion_budget: int) -> int:
    """The tokens a call may use, guessed before it is made: prompt characters / 4 plus its budget."""
    return sum(len(m.content) for m in messages) // CHARS_PER_TOKEN + completion_budget


class TokenBucket:
    """A token bucket refilled continuously at `rate_per_minute`; waiters queue FIFO on a lock.

    A waiter that finds too little sleeps exactly until the deficit has refilled (one sleep,
    no polling). A request larger than the bucket waits for a full bucket and goes into debt,
    so one oversized call cannot block the queue forever.
    """

    def __init__(
        self, rate_per_minute: float, *, burst_s: float = BUCKET_BURST_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate_per_minute <= 0:
            raise ValueError(f"rate_per_minute must be positive, got {rate_per_minute}")
        self.rate_per_s = rate_per_minute / 60.0
        self.capacity = self.rate_per_s * burst_s
        self._clock = clock
        self._level = self.capacity
        self._stamp = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._stamp) * self.rate_per_s)
        self._stamp = now

    async def take(self, amount: float) -> float:
        """Take `amount` (waiting if needed); returns the seconds spent waiting."""
        waited = 0.0
        async with self._lock:
            self._refill()
            needed = min(amount, self.capacity)
            if self._level < needed:
                delay = (needed - self._level) / self.rate_per_s
                await asyncio.sleep(delay)
                waited = delay
                self._refill()
            self._level -= amount
        return waited

    def give_back(self, amount: float) -> None:
        """Credit (positive) or debit (negative) the bucket after the true usage is known."""
        self._refill()
        self._level = min(self.capacity, self._level + amount)


@dataclass(slots=True)
class GovernorStats:
    """What the governor saw: peaks prove the limits held; waits show where the pool is throttled."""

    in_flight: int = 0
    peak_in_flight: int = 0
    per_worker_in_flight: dict[str, int] = field(default_factory=dict)
    per_worker_peak: dict[str, int] = field(default_factory=dict)
    slots_granted: int = 0
    waits: int = 0  # slots that could not be granted at once
    wait_s: float = 0.0  # total seconds callers spent waiting for slots and rate budget
    rate_waits: int = 0  # of those waits, how many were for the RPM/TPM buckets


@dataclass(slots=True)
class SlotLease:
    """Handed to the holder of a slot; `report_tokens` settles the TPM bucket with the true usage."""

    worker: str
    est_tokens: int
    _governor: Governor

    def report_tokens(self, actual_tokens: int) -> None:
        """Correct the token budget once the call's real usage is known (estimate minus actual)."""
        bucket = self._governor._tokens_bucket
        if bucket is not None:
            bucket.give_back(self.est_tokens - actual_tokens)
            self.est_tokens = actual_tokens


class Governor:
    """Global and per-worker in-flight limits plus optional request and token rate limits.

    `async with governor.slot("q9", est_tokens=900):` waits for the seat's own limit first,
    then for the pool-wide limit (so a busy seat never holds pool-wide slots while it queues),
    then for rate budget.
    """

    def __init__(
        self,
        max_in_flight: int,
        per_worker: Mapping[str, int],
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        *,
        rate_burst_s: float = BUCKET_BURST_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_in_flight <= 0:
            raise ValueError(f"max_in_flight must be positive, got {max_in_flight}")
        bad = {name: limit for name, limit in per_worker.items() if limit <= 0}
        if bad:
            raise ValueError(f"per-worker limits must be positive: {bad}")
        self.max_in_flight = max_in_flight
        self.per_worker_limits = dict(per_worker)
        self._global = asyncio.Semaphore(max_in_flight)
        self._per_worker = {name: asyncio.Semaphore(limit) for name, limit in per_worker.items()}
        self._requests_bucket = (
            TokenBucket(requests_per_minute, burst_s=rate_burst_s, clock=clock) if requests_per_minute else None
        )
        self._tokens_bucket = (
            TokenBucket(tokens_per_minute, burst_s=rate_burst_s, clock=clock) if tokens_per_minute else None
        )
        self._clock = clock
        self.stats = GovernorStats(
            per_worker_in_flight=dict.fromkeys(per_worker, 0), per_worker_peak=dict.fromkeys(per_worker, 0)
        )

    @classmethod
    def from_pool(cls, pool: PoolConfig) -> Governor:
        """The governor a pool file asks for: its global limits and each seat's `concurrency`."""
        return cls(
            max_in_flight=pool.governor.max_in_flight,
            per_worker={seat.name: seat.concurrency for seat in pool.workers},
            requests_per_minute=pool.governor.requests_per_minute,
            tokens_per_minute=pool.governor.tokens_per_minute,
        )

    @asynccontextmanager
    async def slot(self, worker: str, est_tokens: int = 0) -> AsyncIterator[SlotLease]:
        """Hold one in-flight slot for `worker` for the duration of the block."""
        try:
            seat_sem = self._per_worker[worker]
        except KeyError:
            raise KeyError(f"governor has no limit for worker {worker!r}; known: {sorted(self._per_worker)}") from None
        stats = self.stats
        started = self._clock()
        had_to_wait = seat_sem.locked() or self._global.locked()
        async with seat_sem, self._global:
            rate_wait = 0.0
            if self._requests_bucket is not None:
                rate_wait += await self._requests_bucket.take(1)
            if self._tokens_bucket is not None and est_tokens > 0:
                rate_wait += await self._tokens_bucket.take(est_tokens)
            if rate_wait > 0:
                stats.rate_waits += 1
                had_to_wait = True
            if had_to_wait:
                stats.waits += 1
                stats.wait_s += self._clock() - started
            stats.slots_granted += 1
            stats.in_flight += 1
            stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
            stats.per_worker_in_flight[worker] += 1
            stats.per_worker_peak[worker] = max(stats.per_worker_peak[worker], stats.per_worker_in_flight[worker])
            try:
                yield SlotLease(worker=worker, est_tokens=est_tokens, _governor=self)
            finally:
                stats.in_flight -= 1
                stats.per_worker_in_flight[worker] -= 1
