"""Outcomes of a replay pool's recordings, graded without probing them through the warehouse.

A replay pool of forty recorded models answers the same questions a probe run would ask; grading
the recordings directly gives the same outcome per (question, worker, sample) as probing each seat
would write, at the cost of one grading pass over tens of thousands of responses. That pass is
cached in a parquet file whose name is a hash of everything the result depends on: the recording
files' registered sha256, the grader's source code and math-verify version, the seats (models,
prices) and the questions with their golds and prompts. A rerun with the same inputs reads the
file; any change to them writes a new one.

Rows follow the replay backend exactly: a ZeroEval seat has one sample per recorded question (its
response graded by the project grader, tokens estimated from characters, cost from the seat's list
prices); a RouterDC seat has its ten recorded verdicts per GSM8K question and no text, so no cost.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import polars as pl

import conductor_pipeline.grading as grading
from conductor_pipeline.corpora.sources import data_source, resolve_data_file
from conductor_pipeline.files import DamagedArtifactError, read_parquet_checked, write_parquet_atomic
from conductor_pipeline.grading import grade_many
from conductor_pipeline.pools.backends.replay import (
    ROUTERDC_SAMPLES,
    SOURCE_KEYS,
    estimate_tokens,
    routerdc_correct_counts,
    routerdc_sample_correct,
    zeroeval_responses,
)
from conductor_pipeline.pools.config import PoolConfig
from conductor_pipeline.probing.runner import probe_messages
from conductor_pipeline.records import Question

SAMPLE_OUTCOME_SCHEMA: dict[str, pl.DataType] = {
    "question_id": pl.String(),
    "worker": pl.String(),
    "sample": pl.Int32(),
    "correct": pl.Boolean(),
    "cost_usd": pl.Float64(),
    "tokens_estimated": pl.Boolean(),
}
# The same seed the replay backend uses by default for RouterDC's sample-to-verdict assignment.
ROUTERDC_SEED = 0


class RecordedOutcomesError(ValueError):
    """A pool whose seats cannot be replayed from recordings (names the pool and the seat)."""


def grader_fingerprint() -> str:
    """A hash of the grader's source files and math-verify's version: changes whenever a verdict could."""
    digest = hashlib.sha256()
    for path in sorted(Path(grading.__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    try:
        digest.update(version("math-verify").encode())
    except PackageNotFoundError:
        digest.update(b"math-verify: not installed")
    return digest.hexdigest()


def _prompt_text(question: Question) -> str:
    """What a probe of `question` sends, as the replay backend counts its prompt tokens."""
    return "".join(message.content for message in probe_messages(question))


def outcomes_cache_key(pool: PoolConfig, questions: Sequence[Question]) -> str:
    """The hash that names a cached result: every input the outcomes depend on."""
    sources = sorted({seat.replay_source for seat in pool.workers if seat.replay_source})
    payload = {
        "recordings": {SOURCE_KEYS[source]: data_source(SOURCE_KEYS[source]).sha256 for source in sources},
        "grader": grader_fingerprint(),
        "seats": [seat.model_dump(mode="json") for seat in pool.workers],
        "questions": hashlib.sha256(
            "\n".join(f"{q.question_id}\x1f{q.answer}\x1f{_prompt_text(q)}" for q in questions).encode()
        ).hexdigest(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _zeroeval_rows(pool: PoolConfig, by_id: dict[str, Question], grade_processes: int) -> pl.DataFrame:
    path = resolve_data_file(SOURCE_KEYS["zeroeval"])
    workers, question_ids, responses = [], [], []
    for seat in pool.workers:
        if seat.replay_source != "zeroeval":
            continue
        for question_id, response in zeroeval_responses(seat.model, path).items():
            if question_id in by_id:
                workers.append(seat.name)
                question_ids.append(question_id)
                responses.append(response)
    grades = grade_many(responses, [by_id[q].answer for q in question_ids], processes=grade_processes)
    seats = {seat.name: seat for seat in pool.workers}
    prompt_tokens = {q: estimate_tokens(_prompt_text(question)) for q, question in by_id.items()}
    costs = [
        seats[w].cost_usd(prompt_tokens[q], estimate_tokens(text))
        for w, q, text in zip(workers, question_ids, responses, strict=True)
    ]
    return pl.DataFrame(
        {
            "question_id": question_ids,
            "worker": workers,
            "sample": [0] * len(workers),
            # A blank recording replays as `empty`, which the probe scores as the worker's failure.
            "correct": [g.correct and bool(text.strip()) for g, text in zip(grades, responses, strict=True)],
            "cost_usd": costs,
            "tokens_estimated": [True] * len(workers),
        },
        schema=SAMPLE_OUTCOME_SCHEMA,
    )


def _routerdc_rows(pool: PoolConfig, by_id: dict[str, Question]) -> pl.DataFrame:
    rows = []
    for seat in pool.workers:
        if seat.replay_source != "routerdc":
            continue
        counts = routerdc_correct_counts(seat.model, resolve_data_file(SOURCE_KEYS["routerdc"]))
        for question_id, n_correct in counts.items():
            if question_id not in by_id:
                continue
            for sample in range(ROUTERDC_SAMPLES):
                correct = routerdc_sample_correct(seat.model, question_id, sample, n_correct, ROUTERDC_SEED)
                rows.append((question_id, seat.name, sample, correct, None, True))
    return pl.DataFrame(rows, schema=SAMPLE_OUTCOME_SCHEMA, orient="row")


def recorded_sample_outcomes(
    pool: PoolConfig,
    questions: Sequence[Question],
    *,
    cache_dir: Path | None = None,
    grade_processes: int = 2,
    log: Callable[[str], None] | None = None,
) -> tuple[pl.DataFrame, bool]:
    """(one row per recorded question x worker x sample of `pool` on `questions`, whether it came
    from the cache). Columns: SAMPLE_OUTCOME_SCHEMA."""
    not_replay = [seat.name for seat in pool.workers if not seat.is_replay or seat.replay_source is None]
    if not_replay:
        raise RecordedOutcomesError(
            f"pool {pool.name!r}: seats {not_replay} are not replay seats, so they have no recordings to grade; "
            "probe the pool and read its outcomes from the warehouse instead"
        )
    cache_path = None
    if cache_dir is not None:
        cache_path = Path(cache_dir) / f"{pool.name}-outcomes-{outcomes_cache_key(pool, questions)[:20]}.parquet"
        if cache_path.is_file():
            try:
                return read_parquet_checked(cache_path, "graded-recordings cache").cast(SAMPLE_OUTCOME_SCHEMA), True
            except DamagedArtifactError as exc:  # a cache: recompute it, and say why
                if log:
                    log(f"{exc}: grading the recordings again")
    by_id = {q.question_id: q for q in questions}
    if log:
        log(f"grading the recordings of {len(pool.workers)} seats on {len(by_id)} questions (cached afterwards)")
    frame = pl.concat([_zeroeval_rows(pool, by_id, grade_processes), _routerdc_rows(pool, by_id)])
    if cache_path is not None:  # atomic: a concurrent reader sees the whole file or none
        write_parquet_atomic(frame, cache_path, "graded-recordings cache")
    return frame, False
