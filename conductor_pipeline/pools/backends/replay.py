"""Replay backend: a seat answers with a real model's recorded response to the question.

Replay makes routing (which worker for which question) measurable and trainable at zero
cost: a call about question q returns the recording for q whatever the subtask text says,
so decomposition and access lists have no effect.

Two sources:

- `zeroeval`: one greedy response per (model, question) on MATH level-5 and GSM8K test,
  with its text. One recording is ONE sample: sample index > 0 is `not_recorded`, because
  k identical copies of one response would fake confidence in a pass rate.
- `routerdc`: only the fraction of 10 samples (T=0.2) each model got right on GSM8K test.
  Sample i in 0..9 replays as correct for exactly round(score*10) of the 10 indices, picked
  by a seeded permutation, so multi-sample statistics are real; samples >= 10 are
  `not_recorded`. That file has no license: use it in tests and optional pools only.
"""

from __future__ import annotations

from collections.abc import Sequence
import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

import polars as pl

from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.pools.governor import CHARS_PER_TOKEN
from conductor_pipeline.records import CallRequest, CallResult, CallStatus

# RouterDC scored GSM8K test with lm-eval's `gsm8k-repeat10`: every score is k/10.
ROUTERDC_SAMPLES = 10
# Data-source keys of conductor_pipeline.sources for each replay source.
SOURCE_KEYS = {"zeroeval": "zeroeval_outputs", "routerdc": "routerdc_gsm8k_test"}
ZEROEVAL_BENCHMARKS = ("gsm", "math-l5")


def estimate_tokens(text: str | None) -> int | None:
    """Token count guessed from text length (None for no text). The recordings carry no usage
    block, so these counts (and the cost derived from them) are marked as estimates."""
    if text is None:
        return None
    return max(1, round(len(text) / CHARS_PER_TOKEN)) if text else 0


def _resolve(source: str, explicit: str | Path | None) -> Path:
    if explicit is not None:
        return Path(explicit)
    from conductor_pipeline.corpora.sources import resolve_data_file  # noqa: PLC0415 (data registry, loaded on use)

    return Path(resolve_data_file(SOURCE_KEYS[source]))


# The recording's question key: GSM8K rows carry a test-split line index, MATH rows a unique_id.
ZEROEVAL_QUESTION_ID = (
    pl.when(pl.col("benchmark") == "gsm")
    .then(pl.lit("gsm8k:test:") + pl.col("gsm8k_test_index").cast(pl.String))
    .otherwise(pl.col("math_unique_id"))
    .alias("question_id")
)


@cache
def _zeroeval_frame(path: Path) -> pl.DataFrame:
    """Every recorded (benchmark, model_file, ze_model_name, question_id, output) row, read once."""
    return pl.read_parquet(
        path, columns=["benchmark", "model_file", "ze_model_name", "math_unique_id", "gsm8k_test_index", "output"]
    ).select(
        "benchmark",
        "model_file",
        "ze_model_name",
        ZEROEVAL_QUESTION_ID,
        "output",
    )


@cache
def zeroeval_responses(model: str, path: Path) -> dict[str, str]:
    """question_id -> recorded response text of `model` on both benchmarks.

    Per benchmark the model is matched on `model_file` first, else on ZeroEval's display name
    `ze_model_name` (e.g. `gemma-2-27b-it` is `gemma-2-27b-it@together` on GSM8K).
    """
    frame = _zeroeval_frame(path)
    parts = []
    for benchmark in ZEROEVAL_BENCHMARKS:
        rows = frame.filter(pl.col("benchmark") == benchmark)
        hit = rows.filter(pl.col("model_file") == model)
        if hit.is_empty():
            hit = rows.filter(pl.col("ze_model_name") == model)
        parts.append(hit)
    matched = pl.concat(parts)
    return {qid: only_output(out) for qid, out in zip(matched["question_id"], matched["output"], strict=True)}


def zeroeval_models(path: str | Path | None = None) -> pl.DataFrame:
    """Recorded model files with their display name and per-benchmark question counts."""
    frame = _zeroeval_frame(_resolve("zeroeval", path))
    return (
        frame.group_by("model_file", "ze_model_name", "benchmark")
        .len()
        .pivot(on="benchmark", index=["model_file", "ze_model_name"], values="len")
        .fill_null(0)
        .sort("model_file")
    )


def unrecorded_seats(seats: Sequence[WorkerSeat], data_path: str | Path | None = None) -> dict[str, str]:
    """{seat name: its model} of the replay seats whose source holds no recording of their model:
    what a pool file is refused for before anything is probed, trained or written."""
    known: dict[str, set[str]] = {}
    for source in sorted({seat.replay_source for seat in seats if seat.is_replay and seat.replay_source}):
        if source == "zeroeval":
            models = zeroeval_models(data_path)
            known[source] = set(models["model_file"].to_list()) | set(models["ze_model_name"].to_list())
        else:
            known[source] = set(routerdc_models(data_path))
    return {
        seat.name: seat.model for seat in seats
        if seat.is_replay and seat.replay_source and seat.model not in known[seat.replay_source]
    }


def only_output(raw: str) -> str:
    """`output` is a JSON list holding the one response text."""
    items = json.loads(raw)
    if not isinstance(items, list) or len(items) != 1:
        raise ValueError(f"expected a one-element JSON list in `output`, got {raw[:80]!r}")
    return str(items[0])


@cache
def routerdc_correct_counts(model: str, path: Path) -> dict[str, int]:
    """question_id -> how many of the 10 recorded samples of `model` were correct."""
    rows = json.loads(path.read_text())
    counts: dict[str, int] = {}
    for index, row in enumerate(rows):
        scores = row["scores"]
        if model not in scores:
            raise KeyError(f"RouterDC file {path} has no model {model!r}; models: {sorted(scores)}")
        counts[f"gsm8k:test:{index}"] = round(float(scores[model]) * ROUTERDC_SAMPLES)
    return counts


def routerdc_models(path: str | Path | None = None) -> list[str]:
    rows = json.loads(_resolve("routerdc", path).read_text())
    return list(rows[0]["scores"])


def routerdc_sample_correct(model: str, question_id: str, sample: int, n_correct: int, seed: int) -> bool:
    """Whether replayed sample `sample` is one of the `n_correct` correct ones.

    A permutation of the 10 indices seeded by (seed, model, question) puts exactly n_correct
    of them first, so any 10 samples reproduce the recorded fraction exactly, and the
    assignment is the same in every process and every run.
    """
    order = list(range(ROUTERDC_SAMPLES))
    random.Random(f"{seed}\x1f{model}\x1f{question_id}").shuffle(order)
    return order.index(sample) < n_correct


@dataclass
class ReplayWorker:
    """A pool seat that replays recorded answers (the `RecordedWorker` protocol).

    `data_path` overrides the registry file (tests, mirrors); `seed` fixes RouterDC's
    sample-to-verdict assignment.
    """

    seat: WorkerSeat
    data_path: str | Path | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.seat.is_replay or self.seat.replay_source is None:
            raise ValueError(f"worker {self.seat.name!r} is not a replay seat")
        self.name = self.seat.name
        self.source = self.seat.replay_source
        path = _resolve(self.source, self.data_path)
        if self.source == "zeroeval":
            self._responses = zeroeval_responses(self.seat.model, path)
            self._counts: dict[str, int] = {}
            if not self._responses:
                raise ValueError(f"worker {self.name!r}: no ZeroEval recordings for model {self.seat.model!r}")
        else:
            self._responses = {}
            self._counts = routerdc_correct_counts(self.seat.model, path)
        self._question_ids = frozenset(self._responses if self.source == "zeroeval" else self._counts)

    @property
    def samples_recorded(self) -> int:
        """How many distinct samples per question the source holds."""
        return 1 if self.source == "zeroeval" else ROUTERDC_SAMPLES

    @property
    def question_ids(self) -> frozenset[str]:
        """Questions this seat has recordings for."""
        return self._question_ids

    def covers(self, question_id: str, sample: int = 0) -> bool:
        """Whether a call for this question and sample index replays a recording."""
        return 0 <= sample < self.samples_recorded and question_id in self.question_ids

    async def call(self, request: CallRequest) -> CallResult:
        started_at = datetime.now(UTC)
        question_id = request.question.question_id
        if not self.covers(question_id, request.sample):
            why = (
                f"{self.source} holds {self.samples_recorded} sample(s) per question; sample {request.sample} "
                if request.sample >= self.samples_recorded or request.sample < 0
                else f"{self.source} has no recording of {self.seat.model!r} for {question_id!r}"
            )
            return CallResult(status=CallStatus.NOT_RECORDED, error=why.strip(), started_at=started_at, latency_s=None)
        prompt_tokens = estimate_tokens("".join(m.content for m in request.messages))
        if self.source == "routerdc":
            correct = routerdc_sample_correct(
                self.seat.model, question_id, request.sample, self._counts[question_id], self.seed
            )
            # Only a verdict was recorded: no text, so no completion tokens and no cost estimate.
            return CallResult(
                status=CallStatus.OK,
                recorded_correct=correct,
                prompt_tokens=prompt_tokens,
                tokens_estimated=True,
                started_at=started_at,
            )
        response = self._responses[question_id]
        completion_tokens = estimate_tokens(response)
        return CallResult(
            status=CallStatus.OK if response.strip() else CallStatus.EMPTY,
            response=response,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            tokens_estimated=True,  # and so cost_usd is an estimate too
            cost_usd=self.seat.cost_usd(prompt_tokens, completion_tokens),
            latency_s=None,  # the recording has no timing
            started_at=started_at,
        )

    async def aclose(self) -> None:
        """Nothing to release: the recordings are cached per process."""
