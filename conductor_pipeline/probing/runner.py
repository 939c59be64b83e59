"""Probing: every (question, worker, sample) call of a pool, graded and written as it completes.

A probe measures what each worker can do alone, k samples per question (one sample is a coin
flip). The run is resumable by construction: each call's key is a stable id of
(pool, question, worker, sample), the plan skips keys already in the warehouse, and results
are written in small batches as they complete, so a crash or kill loses at most the batch in
flight and a rerun redoes exactly that, with no duplicate and no gap.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from conductor_pipeline.grading import grade_many
from conductor_pipeline.pools.backends.base import RecordedWorker, Worker
from conductor_pipeline.pools.config import PoolConfig
from conductor_pipeline.pools.governor import Governor, estimate_call_tokens
from conductor_pipeline.records import CallRecord, CallRequest, CallResult, CallStatus, ChatMessage, Question, stable_id
from conductor_pipeline.warehouse import Warehouse

PROBE_KIND = "probe"
# Rows per warehouse write: a kill loses at most this many finished calls, and each write
# holds the warehouse lock for milliseconds.
DEFAULT_BATCH_SIZE = 500
# A partial batch is written after this long anyway, so slow endpoints still persist progress.
FLUSH_INTERVAL_S = 2.0
# Completion tokens a probe is expected to use, for the governor's tokens-per-minute budget
# until the true usage is reported back.
EST_COMPLETION_TOKENS = 512
# The probe asks the question itself; the answer format matches what the grader reads first.
PROBE_SYSTEM_PROMPT = (
    "Solve the following math problem. Reason step by step, then give the final answer "
    "in the form \\boxed{answer}."
)
# Statuses whose calls are graded from their text (truncated text may still hold an answer).
_GRADED_FROM_TEXT = (CallStatus.OK, CallStatus.TRUNCATED)


@dataclass(frozen=True, slots=True)
class ProbeProgress:
    """Reported after every batch write."""

    done: int  # calls written in this run
    total: int  # calls this run had to issue
    elapsed_s: float
    status_counts: Mapping[str, int]

    @property
    def rate_per_s(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        rate = self.rate_per_s
        return (self.total - self.done) / rate if rate > 0 else None

    def describe(self) -> str:
        eta = f"{self.eta_s:.0f}s" if self.eta_s is not None else "?"
        return f"{self.done}/{self.total} calls, {self.rate_per_s:.1f}/s, ETA {eta}"


@dataclass(slots=True)
class ProbeSummary:
    """What one run of `run_probes` did."""

    planned: int  # (question, worker, sample) triples in the slice
    already_done: int  # of those, found in the warehouse and skipped
    skipped_unrecorded: int  # replay triples with no recording, not issued (only_recorded)
    issued: int  # calls made in this run
    written: int  # new rows in the warehouse
    elapsed_s: float
    status_counts: dict[str, int] = field(default_factory=dict)
    per_worker_status: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def rate_per_s(self) -> float:
        return self.issued / self.elapsed_s if self.elapsed_s > 0 else 0.0


def probe_call_id(pool: str, question_id: str, worker: str, sample: int) -> str:
    """The key of one probe call: the same in every run, so reruns skip what is written."""
    return stable_id(PROBE_KIND, pool, question_id, worker, sample)


def probe_messages(question: Question) -> tuple[ChatMessage, ...]:
    return (ChatMessage("system", PROBE_SYSTEM_PROMPT), ChatMessage("user", question.problem))


@dataclass(frozen=True, slots=True)
class _Planned:
    call_id: str
    question: Question
    worker: str
    sample: int


@dataclass(slots=True)
class _Done:
    planned: _Planned
    result: CallResult


def plan_probes(
    warehouse: Warehouse,
    pool: PoolConfig,
    workers: Mapping[str, Worker],
    questions: Sequence[Question],
    *,
    samples: int,
    sample_offset: int = 0,
    only_recorded: bool = False,
    retry_transient: bool = True,
) -> tuple[list[_Planned], int, int]:
    """(calls to issue, triples already written, triples skipped as unrecorded)."""
    existing = warehouse.query_file("probe_call_status", {"pool": pool.name})
    written = dict(zip(existing["call_id"].to_list(), existing["status"].to_list(), strict=True))
    pending: list[_Planned] = []
    already = unrecorded = 0
    for name, worker in workers.items():
        covers = worker.covers if only_recorded and isinstance(worker, RecordedWorker) else None
        for question in questions:
            for sample in range(sample_offset, sample_offset + samples):
                call_id = probe_call_id(pool.name, question.question_id, name, sample)
                status = written.get(call_id)
                if status is not None and not (retry_transient and status == CallStatus.TRANSIENT):
                    already += 1
                    continue
                if covers is not None and not covers(question.question_id, sample):
                    unrecorded += 1
                    continue
                # A transient row stays until the reissued call's row replaces it (`insert_calls`).
                pending.append(_Planned(call_id, question, name, sample))
    return pending, already, unrecorded


def grade_results(done: Sequence[_Done], *, pool: str, run_id: str, processes: int = 2) -> list[CallRecord]:
    """Turn finished calls into `calls` rows: text graded by the project grader in one batch.

    A replay verdict (`recorded_correct`) is used as is; `empty` and `terminal` count as the
    worker's failure; `transient` and `not_recorded` are not scored (correct NULL).
    """
    to_grade = [
        i
        for i, d in enumerate(done)
        if d.result.status in _GRADED_FROM_TEXT and d.result.recorded_correct is None and d.result.response
    ]
    grades = grade_many(
        [done[i].result.response for i in to_grade],
        [done[i].planned.question.answer for i in to_grade],
        processes=processes,
    )
    graded = dict(zip(to_grade, grades, strict=True))
    records = []
    for index, item in enumerate(done):
        result, planned = item.result, item.planned
        status = CallStatus(result.status)
        extracted: str | None = None
        if not status.scored:
            correct: bool | None = None
        elif result.recorded_correct is not None:
            correct = bool(result.recorded_correct)
        elif index in graded:
            extracted, correct = graded[index].extracted, graded[index].correct
        else:
            correct = False  # empty, terminal, or no text at all
        records.append(
            CallRecord(
                call_id=planned.call_id,
                run_id=run_id,
                kind=PROBE_KIND,
                question_id=planned.question.question_id,
                worker=planned.worker,
                sample=planned.sample,
                subtask=None,  # a probe asks the question itself (see the `questions` table)
                response=result.response,
                extracted_answer=extracted,
                correct=correct,
                status=status.value,
                error=result.error,
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                cost_usd=result.cost_usd,
                latency_s=result.latency_s,
                started_at=result.started_at,
                pool=pool,
                reasoning_tokens=result.reasoning_tokens,
                tokens_estimated=result.tokens_estimated,
                finish_reason=result.finish_reason,
                attempts=result.attempts,
            )
        )
    return records


async def _call_one(worker: Worker, governor: Governor, planned: _Planned, request: CallRequest) -> CallResult:
    async with governor.slot(planned.worker, estimate_call_tokens(request.messages, EST_COMPLETION_TOKENS)) as lease:
        try:
            result = await worker.call(request)
        except Exception as exc:  # a backend bug must not lose the call: record it, unscored
            result = CallResult(
                status=CallStatus.TRANSIENT,
                error=f"worker raised {type(exc).__name__}: {exc}"[:500],
                started_at=datetime.now(UTC),
            )
        used = (result.prompt_tokens or 0) + (result.completion_tokens or 0)
        if used:
            lease.report_tokens(used)
    return result


async def run_probes(
    warehouse: Warehouse,
    pool: PoolConfig,
    workers: Mapping[str, Worker],
    questions: Sequence[Question],
    *,
    samples: int,
    sample_offset: int = 0,
    temperature: float,
    run_id: str,
    governor: Governor,
    batch_size: int = DEFAULT_BATCH_SIZE,
    on_progress: Callable[[ProbeProgress], None] | None = None,
    only_recorded: bool = False,
    retry_transient: bool = True,
    grade_processes: int = 2,
    flush_interval_s: float = FLUSH_INTERVAL_S,
) -> ProbeSummary:
    """Issue every probe call of the slice not yet in the warehouse; write rows as they complete.

    `only_recorded` skips triples a replay worker has no recording for (its `covers`), so a run
    does not spend rows on `not_recorded`. `retry_transient` reissues calls whose stored status
    is `transient`. Grading runs in a thread (math-verify residue in worker processes), so the
    event loop keeps calls flowing meanwhile.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    unknown = sorted(set(workers) - set(pool.worker_names))
    if unknown:
        raise KeyError(f"workers {unknown} are not seats of pool {pool.name!r}")
    started = time.monotonic()
    pending, already, unrecorded = await asyncio.to_thread(
        plan_probes,
        warehouse,
        pool,
        workers,
        questions,
        samples=samples,
        sample_offset=sample_offset,
        only_recorded=only_recorded,
        retry_transient=retry_transient,
    )
    summary = ProbeSummary(
        planned=len(pending) + already + unrecorded,
        already_done=already,
        skipped_unrecorded=unrecorded,
        issued=0,
        written=0,
        elapsed_s=0.0,
    )
    by_worker: dict[str, list[_Planned]] = {}
    for item in pending:
        by_worker.setdefault(item.worker, []).append(item)
    # Bounded, so a slow writer holds calls back instead of piling up results a kill would lose.
    finished: asyncio.Queue[_Done | None] = asyncio.Queue(maxsize=2 * batch_size)
    status_counts: Counter[str] = Counter()
    per_worker: dict[str, Counter[str]] = {name: Counter() for name in workers}

    async def seat_consumer(name: str, queue: list[_Planned]) -> None:
        worker = workers[name]
        while queue:
            planned = queue.pop()
            request = CallRequest(
                question=planned.question,
                messages=probe_messages(planned.question),
                sample=planned.sample,
                temperature=temperature,
            )
            result = await _call_one(worker, governor, planned, request)
            await finished.put(_Done(planned, result))

    async def writer() -> None:
        done_total = 0
        exhausted = False
        while not exhausted:
            first = await finished.get()
            if first is None:
                break
            batch = [first]
            deadline = time.monotonic() + flush_interval_s
            while len(batch) < batch_size:
                try:
                    item = finished.get_nowait()
                except asyncio.QueueEmpty:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(finished.get(), remaining)
                    except TimeoutError:
                        break
                if item is None:
                    exhausted = True
                    break
                batch.append(item)
            records = await asyncio.to_thread(
                grade_results, batch, pool=pool.name, run_id=run_id, processes=grade_processes
            )
            summary.written += await asyncio.to_thread(warehouse.insert, "calls", records)
            for record in records:
                status_counts[record.status] += 1
                per_worker[record.worker][record.status] += 1
            done_total += len(records)
            summary.issued = done_total
            if on_progress is not None:
                on_progress(ProbeProgress(done_total, len(pending), time.monotonic() - started, dict(status_counts)))

    async with asyncio.TaskGroup() as group:
        writer_task = group.create_task(writer())
        seats = []
        for name, queue in by_worker.items():
            queue.reverse()  # pop() from the end keeps the planned order
            limit = pool.seat(name).concurrency
            seats += [group.create_task(seat_consumer(name, queue)) for _ in range(min(limit, len(queue)))]
        await asyncio.gather(*seats)
        await finished.put(None)
        await writer_task
    summary.elapsed_s = time.monotonic() - started
    summary.status_counts = dict(status_counts)
    summary.per_worker_status = {name: dict(counts) for name, counts in per_worker.items()}
    return summary


def select_questions(
    warehouse: Warehouse,
    *,
    corpora: Sequence[str],
    splits: Sequence[str],
    math_levels: Sequence[int],
    limit: int | None = None,
) -> list[Question]:
    """The probe slice from the warehouse's `questions` table (sql/probe_questions.sql)."""
    frame = warehouse.query_file(
        "probe_questions",
        {"corpora": list(corpora), "splits": list(splits), "math_levels": list(math_levels), "limit": limit},
    )
    return [Question(**row) for row in frame.iter_rows(named=True)]


def next_sample_offset(warehouse: Warehouse, pool: str) -> int:
    """The first sample index above every probe sample written for `pool` (0 when none is)."""
    highest = warehouse.query_file("max_probe_sample", {"pool": pool})["max_sample"][0]
    return 0 if highest is None else int(highest) + 1


# Progress is logged at most this often: a replay probe completes thousands of calls per second.
PROGRESS_LOG_INTERVAL_S = 5.0


def probe_and_close(
    warehouse: Warehouse,
    pool: PoolConfig,
    workers: Mapping[str, Worker],
    questions: Sequence[Question],
    *,
    samples: int,
    sample_offset: int = 0,
    temperature: float,
    run_id: str,
    governor_factory: Callable[[], Governor],
    log: Callable[[str], None],
    batch_size: int = DEFAULT_BATCH_SIZE,
    only_recorded: bool = False,
    progress_log_interval_s: float = PROGRESS_LOG_INTERVAL_S,
) -> ProbeSummary:
    """`run_probes` from synchronous code, in a fresh event loop; every worker is closed afterwards.
    Seats that cannot answer alone (conductor, vote) are left out, with a log line.

    The governor is built inside that loop (`governor_factory`), since its limits belong to one
    loop. `log` gets one line at the start and throttled progress lines, always including the last.
    """
    last_logged = float("-inf")

    def on_progress(report: ProbeProgress) -> None:
        nonlocal last_logged
        now = time.monotonic()
        if now - last_logged >= progress_log_interval_s or report.done == report.total:
            last_logged = now
            log(f"probe {pool.name}: {report.describe()}")

    probed = {name: worker for name, worker in workers.items() if pool.seat(name).answers_alone}
    not_probed = sorted(set(workers) - set(probed))
    if not_probed:
        log(f"not probing {not_probed}: a conductor or vote seat answers only within a workflow, never alone")

    async def probe() -> ProbeSummary:
        try:
            return await run_probes(
                warehouse,
                pool,
                probed,
                questions,
                samples=samples,
                sample_offset=sample_offset,
                temperature=temperature,
                run_id=run_id,
                governor=governor_factory(),
                batch_size=batch_size,
                on_progress=on_progress,
                only_recorded=only_recorded,
            )
        finally:
            for worker in workers.values():
                await worker.aclose()

    log(f"probing {len(probed)} worker(s) of {pool.name} on {len(questions)} questions, "
        f"samples {sample_offset}..{sample_offset + samples - 1}")
    return asyncio.run(probe())
