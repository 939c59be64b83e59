"""A probe-like run of 2,000 calls at 20% injected faults: every call accounted for exactly once.

The client's ledger (one final status per call, attempts per call) must reconcile with the
server's own counters of what it served, and transient outcomes must never be scored.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter

import pytest

from tests.fakes import FaultKind, FaultRates, FaultServer
from conductor_pipeline.grading import grade
from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker, shared_http_client
from conductor_pipeline.pools.config import RetryConfig
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import CallRecord, CallResult, CallStatus, stable_id
from tests.builders import make_request, make_seat

N_CALLS = 2_000
N_QUESTIONS = 500  # x 4 samples
CONCURRENCY = 64
# Each attempt is transient with p = 0.20 * 4/7 ~ 0.114, so with 2 attempts about 2000 * 0.114**2 ~ 26
# calls run out of budget (P(none) ~ 5e-12). With 3 attempts it was ~3 and P(none) ~ 5%: that flaked in CI.
RETRY = RetryConfig(max_attempts=2, base_delay_s=0.005, max_delay_s=1.0)
TRANSIENT_KINDS = ("rate_limit", "server_error", "hang", "reset")
# Attempts that fail before a whole request leaves the client (no free connection, no connect, or
# a write that timed out, on a loaded 2-core box) never reach the server as a request, so they are
# counted apart when reconciling.
NEVER_SENT = re.compile(r"\((ConnectError|ConnectTimeout|PoolTimeout|WriteTimeout)\b")
FAULTS = FaultRates.spread(
    0.20,
    [FaultKind.RATE_LIMIT, FaultKind.SERVER_ERROR, FaultKind.HANG, FaultKind.RESET,
     FaultKind.REASONING_ONLY, FaultKind.TRUNCATED, FaultKind.BAD_REQUEST],
)


def to_record(run_id: str, worker: str, index: int, sample: int, result: CallResult) -> CallRecord:
    """What a probe writes: graded only when the status is scored."""
    request = make_request(index, sample=sample)
    graded = grade(result.response, request.question.answer) if result.status.scored else None
    return CallRecord(
        call_id=stable_id(run_id, worker, request.question.question_id, sample),
        run_id=run_id, kind="probe", question_id=request.question.question_id, worker=worker, sample=sample,
        subtask=None, response=result.response, extracted_answer=graded.extracted if graded else None,
        correct=graded.correct if graded else None, status=result.status.value, error=result.error,
        prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens, cost_usd=result.cost_usd,
        latency_s=result.latency_s, started_at=result.started_at, attempts=result.attempts,
    )


async def probe(srv: FaultServer) -> tuple[list[CallRecord], Governor]:
    governor = Governor(max_in_flight=CONCURRENCY, per_worker={"w0": CONCURRENCY})
    client = shared_http_client(CONCURRENCY)
    worker = OpenAICompatWorker(make_seat(srv.base_url, timeout_s=1.0), RETRY, client=client)

    async def one(index: int, sample: int) -> CallRecord:
        async with governor.slot(worker.name):
            result = await worker.call(make_request(index, sample=sample))
        return to_record("run-faults", worker.name, index, sample, result)

    records = await asyncio.gather(*(one(i, s) for i in range(N_QUESTIONS) for s in range(4)))
    await worker.aclose()
    await client.aclose()
    return records, governor


def test_two_thousand_calls_at_twenty_percent_faults_reconcile(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="conductor_pipeline.pools.backends.openai_compat")
    with FaultServer(latency_s=0.005, faults=FAULTS, retry_after_s=0.05, hang_s=5.0, seed=11) as srv:
        records, governor = asyncio.run(probe(srv))
        served = srv.stats()

    # Every call ends once: no loss, no duplicate keys.
    assert len(records) == N_CALLS
    assert len({r.call_id for r in records}) == N_CALLS
    statuses = Counter(r.status for r in records)
    assert sum(statuses.values()) == N_CALLS

    # The client's ledger matches the server's.
    total_attempts = sum(r.attempts for r in records)
    failed_attempts = [rec.getMessage() for rec in caplog.records if "failed" in rec.getMessage()]
    failed_attempts += [r.error for r in records if r.status == CallStatus.TRANSIENT]
    never_sent = sum(bool(NEVER_SENT.search(message)) for message in failed_attempts)
    assert total_attempts == served.total_requests + never_sent, Counter(
        re.sub(r"[\d.]+", "N", m)[:80] for m in failed_attempts
    )
    assert statuses["ok"] == served.served["ok"]
    assert statuses["truncated"] == served.served["truncated"]
    assert statuses["empty"] == served.served["reasoning_only"]
    assert statuses["terminal"] == served.served["bad_request"]
    transient_served = sum(served.served[k] for k in TRANSIENT_KINDS)
    assert transient_served + never_sent == total_attempts - (N_CALLS - statuses["transient"])
    assert all(served.served[k] > 0 for k in TRANSIENT_KINDS)  # every fault kind was exercised
    assert statuses["transient"] > 0  # some calls did run out of budget

    # Transient outcomes are never scored; everything scored has a verdict.
    for record in records:
        if record.status == CallStatus.TRANSIENT:
            assert record.correct is None and record.attempts == RETRY.max_attempts
        else:
            assert record.correct is not None
    assert all(r.correct for r in records if r.status == CallStatus.OK)

    # The governor's limit held.
    assert governor.stats.peak_in_flight <= CONCURRENCY
    assert governor.stats.in_flight == 0 and governor.stats.slots_granted == N_CALLS
