"""Builders shared by the tests: synthetic records, pools, scripted workers and policies,
synthetic world-model telemetry whose truth is known, and a warehouse reader in another process.
Tests import from here, never from each other."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl

from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.conductor.protocols import PolicyOutput
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import (
    CallRecord,
    CallRequest,
    CallResult,
    CallStatus,
    ChatMessage,
    Question,
    WorkflowRecord,
)
from conductor_pipeline.world_model.features import WorldModelSettings


def make_call(i: int, *, worker: str = "w", correct: bool | None = True, kind: str = "probe") -> CallRecord:
    return CallRecord(
        call_id=f"c{i}-{worker}",
        run_id="run",
        kind=kind,
        question_id=f"q{i % 7}",
        worker=worker,
        sample=i,
        subtask=None,
        response="\\boxed{1}",
        extracted_answer="1",
        correct=correct,
        status="ok" if correct is not None else "transient",
        error=None,
        prompt_tokens=10,
        completion_tokens=5,
        cost_usd=0.0,
        latency_s=0.1,
        started_at=datetime(2026, 1, 1),
    )


def make_workflow(workflow_id: str) -> WorkflowRecord:
    return WorkflowRecord(
        workflow_id=workflow_id, run_id="run", question_id="q1", conductor="c", raw_text="[]", parse_code="ok",
        n_steps=1, workers=["w"], final_answer="1", correct=True,
    )


SAMPLE_QUESTION = Question(
    question_id="test/algebra/1.json", corpus="math", split="test", problem="What is 6 times 7?", answer="42"
)


@dataclass
class RecordingWorker:
    """A Worker (the protocol) that remembers every request and answers from a script."""

    name: str
    answer: str = "42"
    status: CallStatus = CallStatus.OK
    delay_s: float = 0.0
    requests: list[CallRequest] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0

    async def call(self, request: CallRequest) -> CallResult:
        self.requests.append(request)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        if self.status is not CallStatus.OK:
            return CallResult(status=self.status, error="injected")
        return CallResult(
            status=CallStatus.OK, response=f"{self.name} says \\boxed{{{self.answer}}}",
            prompt_tokens=10, completion_tokens=5, cost_usd=0.001, latency_s=0.5,
        )

    async def aclose(self) -> None:
        return None


@dataclass
class ScriptedPolicy:
    """A ConductorPolicy that replies with fixed texts in turn and counts its calls."""

    texts: list[str]
    name: str = "scripted"
    calls: list[list[dict]] = field(default_factory=list)

    async def propose(self, messages, *, n=1, temperature, max_new_tokens, seed=None):
        self.calls.append(messages)
        text = self.texts[min(len(self.calls) - 1, len(self.texts) - 1)]
        return [PolicyOutput(text=text, prompt_tokens=20, completion_tokens=10, latency_s=0.1)] * n

    async def aclose(self) -> None:
        return None


def seat(name: str, backend: str = "replay", concurrency: int = 8, **extra) -> WorkerSeat:
    fields = {"replay_source": "zeroeval"} if backend == "replay" else {}
    return WorkerSeat(
        name=name, backend=backend, model=name, description=f"worker {name}", concurrency=concurrency,
        temperature=0.2, max_tokens=4096, **fields, **extra,
    )


def make_pool(*seats: WorkerSeat) -> PoolConfig:
    return PoolConfig(name="test-pool", workers=list(seats))


def lists(workers: list, subtasks: list[str], access: list) -> str:
    return f"Plan first.\nmodel_id = {workers!r}\nsubtasks = {subtasks!r}\naccess_list = {access!r}\n"


def orchestrate(pool, workers, warehouse=None, **kwargs) -> Orchestrator:
    return Orchestrator(pool, workers, Governor.from_pool(pool), warehouse, **kwargs)


def run_workflow_texts(pool, workers, question, texts: dict[str, str], *, warehouse=None, run_id: str = "scripted") -> dict:
    """Each conductor text of `texts` (arm name -> text) executed on `question`, recorded under its
    arm name in `warehouse` (None: recording nothing); arm name -> its WorkflowRecord."""

    async def main():
        orch = orchestrate(pool, workers, warehouse)
        records = {
            name: await orch.run_workflow_text(question, text, conductor_name="scripted", run_id=run_id, arm=name)
            for name, text in texts.items()
        }
        await orch.flush()
        return records

    return asyncio.run(main())


SYNTHETIC_SUBJECTS = {
    "Geometry": "triangle circle angle area radius",
    "Number Theory": "remainder divisible prime modulo digit",
    "Counting & Probability": "probability choose arrange dice coin",
    "Algebra": "solve equation slope expression simplify",
}


SYNTHETIC_WORKERS = {  # name -> (family, params_b, base skill in logits)
    "alpha-7b": ("alpha", 7.0, -0.5),
    "alpha-70b": ("alpha", 70.0, 0.8),
    "beta-8b": ("beta", 8.0, -0.3),
    "beta-72b": ("beta", 72.0, 1.0),
    "gamma-3b": ("gamma", 3.0, -1.2),
    "gamma-30b": ("gamma", 30.0, 0.4),
}


# One thread: the test machine is shared, and OpenMP threads spin badly when oversubscribed.
FAST_WORLD_MODEL = WorldModelSettings(text_components=8, num_boost_round=200, min_data_in_leaf=20, num_threads=1)


def synthetic_seats() -> dict[str, WorkerSeat]:
    return {
        name: WorkerSeat(
            name=name,
            backend="replay",
            replay_source="zeroeval",
            model=name,
            description=f"synthetic {name}",
            family=family,
            params_b=params,
            price_output_per_mtok=params / 10,
        )
        for name, (family, params, _) in SYNTHETIC_WORKERS.items()
    }


def synthetic_questions(n: int, seed: int) -> list[Question]:
    rng = np.random.default_rng(seed)
    subjects = list(SYNTHETIC_SUBJECTS)
    questions = []
    for i in range(n):
        subject = subjects[i % len(subjects)]
        words = SYNTHETIC_SUBJECTS[subject].split()
        text = f"Question {i}: {' '.join(rng.choice(words, 4))} with {rng.integers(2, 99)} and {rng.integers(2, 99)}?"
        questions.append(
            Question(f"q{i}", "math", "test", text, "1", subject=subject, level=int(rng.integers(1, 6)))
        )
    return questions


def synthetic_frame(questions: list[Question], skill, seed: int) -> pl.DataFrame:
    """One call per (question, worker); success ~ Bernoulli(sigmoid(skill(worker, subject)))."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in questions:
        for worker in SYNTHETIC_WORKERS:
            p = 1 / (1 + math.exp(-skill(worker, q.subject)))
            rows.append(
                {
                    "question_id": q.question_id,
                    "worker": worker,
                    "subtask": q.problem,
                    "problem": q.problem,
                    "corpus": q.corpus,
                    "subject": q.subject,
                    "level": q.level,
                    "correct": bool(rng.random() < p),
                }
            )
    return pl.DataFrame(rows, schema_overrides={"level": pl.Int32})


def specialist_skill(worker: str, subject: str) -> float:
    """Each family is strong in one subject and weak in another: the worker marginal hides it."""
    base = SYNTHETIC_WORKERS[worker][2]
    family = SYNTHETIC_WORKERS[worker][0]
    strong = {"alpha": "Geometry", "beta": "Number Theory", "gamma": "Counting & Probability"}[family]
    weak = {"alpha": "Number Theory", "beta": "Counting & Probability", "gamma": "Algebra"}[family]
    return base + (2.5 if subject == strong else 0.0) - (2.5 if subject == weak else 0.0)


# --- seats on the fault server (tests/conductor_pipeline/pools/conftest.py starts it)

TEST_API_KEY = "sk-test-9f8e7d6c5b4a-DO-NOT-LEAK"
KEY_ENV = "FAULT_SERVER_TEST_KEY"


def make_seat(endpoint: str, **overrides: object) -> WorkerSeat:
    fields: dict = dict(
        name="w0", backend="openai", model="fault-model", description="a seat on the fault server",
        endpoint=endpoint, price_input_per_mtok=2.5, price_output_per_mtok=10.0, max_tokens=1024, timeout_s=2.0,
    )
    fields.update(overrides)
    return WorkerSeat(**fields)


def make_request(index: int = 0, *, sample: int = 0, max_tokens: int | None = None) -> CallRequest:
    question = Question(question_id=f"q{index}", corpus="math", split="test", problem="What is 6*7?", answer="42")
    return CallRequest(
        question=question, messages=(ChatMessage("user", f"Question {index}: what is 6 times 7?"),),
        sample=sample, max_tokens=max_tokens,
    )


def probe_rows(questions, workers, pool: str, *, samples: int, correct=lambda question, worker: True) -> list[dict]:
    """`calls` rows of a finished probe: `samples` scored samples per question x worker, as a probe would write."""
    return [
        {"call_id": f"{q.question_id}|{w}|{s}", "run_id": "fixture", "kind": "probe", "question_id": q.question_id,
         "worker": w, "sample": s, "correct": correct(q, w), "status": "ok", "pool": pool}
        for q in questions
        for w in workers
        for s in range(samples)
    ]


# A reader outside the pipeline (as a DuckDB shell or a notebook would be): opens the file read-only,
# says so with the `calls` rows it sees, holds it until its stdin closes or the hold time passes,
# then prints the rows it sees on the connection it held.
_READER = """
import sys, threading, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print("open", con.execute("SELECT count(*) FROM calls").fetchone()[0], flush=True)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
done.wait(float(sys.argv[2]))
print("held", con.execute("SELECT count(*) FROM calls").fetchone()[0], flush=True)
"""


def start_reader(path: Path, hold_s: float = 120.0) -> tuple[subprocess.Popen[str], int]:
    """A process holding DuckDB file `path` open read-only; returns it and the `calls` rows it saw on opening."""
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(path), str(hold_s)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = reader.stdout.readline().split()
    assert first and first[0] == "open", reader.stderr.read()
    return reader, int(first[1])


def stop_reader(reader: subprocess.Popen[str]) -> int:
    """Let the reader go (at once, or when its hold time ends); returns the rows it saw on its held connection."""
    out, err = reader.communicate(input="", timeout=60)
    assert reader.returncode == 0, err
    return int(out.split()[-1])


# --- evaluation workflows with known outcomes


def eval_workflow_rows(
    arm: str,
    verdicts: list[bool | None],
    *,
    costs: list[float] | float = 0.0,
    workers: list[list[str]] | None = None,
    parse_codes: list[str] | None = None,
    repeat: int = 0,
) -> list[dict]:
    """Rows shaped like `sql/eval_workflows.sql` for one arm and repeat: question i (q000, q001, ...)
    gets verdicts[i] (None: an infrastructure failure), costs[i] and workers[i]."""
    n = len(verdicts)
    costs = costs if isinstance(costs, list) else [costs] * n
    default_worker = arm.split(":", 1)[1] if arm.startswith("solo:") else "w"
    return [
        {
            "workflow_id": f"{arm}-{repeat}-{i}", "run_id": "eval-test", "question_id": f"q{i:03d}", "conductor": arm,
            "parse_code": parse_codes[i] if parse_codes else "ok",
            "n_steps": len(workers[i]) if workers else 1, "workers": workers[i] if workers else [default_worker],
            "final_answer": None, "correct": verdicts[i], "cost_usd": costs[i], "latency_s": None, "arm": arm,
            "repeat": repeat, "infra_failure": verdicts[i] is None,
        }
        for i in range(n)
    ]


def eval_workflows_frame(*row_lists: list[dict]) -> pl.DataFrame:
    schema = {"workers": pl.List(pl.String), "final_answer": pl.String, "latency_s": pl.Float64,
              "correct": pl.Boolean, "cost_usd": pl.Float64}
    return pl.DataFrame([row for rows in row_lists for row in rows], schema_overrides=schema)


class _HostilePayload:
    """What a hostile pickle carries: unpickling it calls `Path.touch` on the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def hostile_pickle(marker: Path) -> bytes:
    """A pickle that creates `marker` when it is loaded: proof that a loader ran it, or did not."""
    import pickle  # noqa: PLC0415 (only this builder pickles)

    return pickle.dumps(_HostilePayload(marker))
