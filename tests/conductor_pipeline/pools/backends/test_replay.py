"""The replay backend on the real recordings: what it answers, and what it refuses to invent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import polars as pl
import pytest

from conductor_pipeline.pools.backends.registry import build_worker
from conductor_pipeline.pools.backends.replay import ROUTERDC_SAMPLES, ReplayWorker
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat, load_pool
from conductor_pipeline.records import CallRequest, CallStatus, ChatMessage, Question
from tests.shared_data import require_shared_data

ZEROEVAL_FILE = "telemetry/zeroeval_gsm_math-l5_outputs.parquet"
ROUTERDC_FILE = "telemetry/routerdc_split2_model7_gsm8k-test.json"


@pytest.fixture
def data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    return require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs", "routerdc_gsm8k_test")


def seat(model: str, source: str = "zeroeval", **extra: object) -> WorkerSeat:
    return WorkerSeat(name="w", backend="replay", model=model, description="d", replay_source=source, **extra)


def ask(worker: ReplayWorker, question_id: str, sample: int = 0, subtask: str = "Solve it.") -> object:
    question = Question(question_id=question_id, corpus="x", split="test", problem="p", answer="0")
    request = CallRequest(question=question, messages=(ChatMessage("user", subtask),), sample=sample)
    return asyncio.run(worker.call(request))


def recorded_output(data_dir: Path, model_file: str, **key: object) -> str:
    frame = pl.read_parquet(data_dir / ZEROEVAL_FILE, columns=["model_file", *key, "output"])
    row = frame.filter(pl.col("model_file") == model_file, *[pl.col(k) == v for k, v in key.items()])
    assert row.height == 1
    return json.loads(row["output"][0])[0]


def test_answers_with_the_recorded_text_whatever_the_subtask(data_dir: Path) -> None:
    worker = ReplayWorker(seat("gpt-4o-2024-08-06", price_input_per_mtok=2.5, price_output_per_mtok=10.0))
    gsm = ask(worker, "gsm8k:test:0", subtask="Ignore the question and write a poem.")
    assert gsm.status == CallStatus.OK
    assert gsm.response == recorded_output(data_dir, "gpt-4o-2024-08-06", gsm8k_test_index=0)
    assert '"answer"' in gsm.response and "18" in gsm.response
    math_id = "test/algebra/2427.json"
    math = ask(worker, math_id)
    assert math.response == recorded_output(data_dir, "gpt-4o-2024-08-06", math_unique_id=math_id)
    # No usage block in a recording: counts and cost are estimates, latency is unknown.
    assert math.tokens_estimated and math.completion_tokens > 0 and math.prompt_tokens > 0
    assert math.cost_usd == pytest.approx((math.prompt_tokens * 2.5 + math.completion_tokens * 10.0) / 1e6)
    assert math.latency_s is None


def test_display_name_finds_the_other_benchmark(data_dir: Path) -> None:
    # MATH file is `gemma-2-27b-it`; on GSM8K the file is `gemma-2-27b-it@together`, display name `gemma-2-27b-it`.
    worker = ReplayWorker(seat("gemma-2-27b-it"))
    assert ask(worker, "gsm8k:test:5").response == recorded_output(
        data_dir, "gemma-2-27b-it@together", gsm8k_test_index=5
    )


def test_unrecorded_question_and_extra_samples_are_not_recorded(data_dir: Path) -> None:
    qwen = ReplayWorker(seat("Qwen2.5-7B-Instruct"))  # recorded on MATH level-5 only
    for result in (ask(qwen, "gsm8k:test:0"), ask(qwen, "test/algebra/1.json")):
        assert result.status == CallStatus.NOT_RECORDED and result.response is None
        assert not CallStatus(result.status).scored
    gpt = ReplayWorker(seat("gpt-4o-2024-08-06"))
    assert ask(gpt, "gsm8k:test:0", sample=0).status == CallStatus.OK
    # One recording is one sample: copies of it would fake confidence.
    assert [ask(gpt, "gsm8k:test:0", sample=s).status for s in (1, 2, 5)] == [CallStatus.NOT_RECORDED] * 3
    assert gpt.samples_recorded == 1 and not gpt.covers("gsm8k:test:0", 1)
    with pytest.raises(ValueError, match="no ZeroEval recordings"):
        ReplayWorker(seat("no-such-model"))


def test_routerdc_samples_reproduce_the_recorded_fractions_exactly(data_dir: Path) -> None:
    rows = json.loads((data_dir / ROUTERDC_FILE).read_text())
    model = "meta-math/MetaMath-Mistral-7B"
    worker = ReplayWorker(seat(model, "routerdc"))
    again = ReplayWorker(seat(model, "routerdc"))
    fractions_seen = set()
    for index in range(0, len(rows), 7):
        question_id = f"gsm8k:test:{index}"
        results = [ask(worker, question_id, sample=s) for s in range(ROUTERDC_SAMPLES)]
        assert all(r.status == CallStatus.OK and r.response is None for r in results)
        verdicts = [r.recorded_correct for r in results]
        assert sum(verdicts) == round(rows[index]["scores"][model] * 10)
        assert verdicts == [ask(again, question_id, sample=s).recorded_correct for s in range(ROUTERDC_SAMPLES)]
        fractions_seen.add(sum(verdicts))
        assert ask(worker, question_id, sample=ROUTERDC_SAMPLES).status == CallStatus.NOT_RECORDED
    assert len(fractions_seen) > 3  # the sweep really met mixed pass rates, not only 0/10 and 10/10


def test_factory_dispatches_on_backend(data_dir: Path) -> None:
    pool = load_pool("replay-mixed6")
    workers = {s.name: build_worker(s, pool) for s in pool.workers}
    assert all(isinstance(w, ReplayWorker) for w in workers.values())
    assert all(w.question_ids and len(w.question_ids) == 2040 for w in workers.values())
    conductor = WorkerSeat(name="self", backend="conductor", model="c", description="the conductor itself")
    with pytest.raises(NotImplementedError, match="conductor"):
        build_worker(conductor, PoolConfig(name="p", workers=[conductor]))
