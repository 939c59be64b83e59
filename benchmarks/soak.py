"""Soak: a probe plus a batch of workflows (>= 5,000 calls) at 20% faults of every kind.

Everything is real: the project's fault-injecting OpenAI-compatible server on 127.0.0.1, a pool
file of `openai` seats pointing at it, `run_probes` and the `Orchestrator` writing to a DuckDB
warehouse. Each seat's Worker is wrapped in a ledger that counts every call the pipeline made and
the status it ended with, so the warehouse can be reconciled against the client's own account
(rows = calls accounted for; none lost, none written twice) and the server's (attempts sent).

    .venv/bin/python -m benchmarks.soak [--questions 600] [--workflows 1100] [--no-write]

prints the figures and writes them into benchmarks/RESULTS-reliability.md (between markers).
`tests/reliability/test_soak.py` runs the same function (RUN_SLOW=1).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from conductor_pipeline.conductor.orchestrator import Orchestrator
from tests.fakes import FaultKind, FaultRates, FaultServer
from conductor_pipeline.pools.backends.openai_compat import shared_http_client
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import PoolConfig, load_pool
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.probing.runner import probe_call_id, run_probes
from conductor_pipeline.records import CallRequest, CallResult, CallStatus, Question
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.workflow import Step, Workflow, render_workflow

RESULTS_FILE = Path(__file__).resolve().parent / "RESULTS-reliability.md"
# Knobs, with their reason:
FAULT_RATE = 0.20  # one call in five faulted, split evenly over every fault kind the server has
ALL_FAULT_KINDS = [kind for kind in FaultKind if kind is not FaultKind.OK]
SEATS = ("w0", "w1", "w2")
SEAT_CONCURRENCY = 24  # x 3 seats, under the pool-wide 64: the governor's both limits are exercised
PROBE_SAMPLES = 2
SEAT_TIMEOUT_S = 1.0  # a `hang` costs one timeout; short so hangs do not dominate the wall time
RETRY = {"max_attempts": 3, "base_delay_s": 0.02, "max_delay_s": 0.5}  # 3: some calls do exhaust it
UNPARSEABLE_SHARE = 0.05  # conductor outputs that fail to parse (recorded, no step calls)


@dataclass
class SoakFigures:
    """What one soak run did, from the client ledger, the warehouse and the fault server."""

    calls_issued: int  # logical calls the pipeline made (probe calls + workflow steps)
    probe_calls: int
    step_calls: int
    workflows: int
    attempts_sent: int  # HTTP requests the server received (retries included)
    calls_retried: int  # calls that needed more than one attempt
    retries: int  # attempts beyond the first, summed
    scored: int  # rows with a verdict (ok, truncated, empty, terminal)
    excluded: int  # rows never scored (transient after the retry budget)
    rows_calls: int  # rows in `calls` for this run
    rows_workflows: int
    lost: int  # calls the ledger saw that have no row
    duplicated: int  # rows beyond one per ledger call
    missing_probe_keys: int  # planned probe keys without a row
    status_counts: dict[str, int] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)  # server's count per fault kind
    elapsed_s: float = 0.0

    def table(self) -> str:
        rows = [
            ("calls issued (probe + workflow steps)", f"{self.calls_issued} ({self.probe_calls} + {self.step_calls})"),
            ("workflows run", self.workflows),
            ("HTTP attempts the server received", self.attempts_sent),
            ("calls retried (attempts > 1) / retries", f"{self.calls_retried} / {self.retries}"),
            ("rows scored", self.scored),
            ("rows excluded (transient after retries)", self.excluded),
            ("rows in `calls` = calls accounted for", f"{self.rows_calls} = {self.calls_issued}"),
            ("rows in `workflows`", self.rows_workflows),
            ("lost / duplicated", f"{self.lost} / {self.duplicated}"),
            ("final statuses", ", ".join(f"{k} {v}" for k, v in sorted(self.status_counts.items()))),
            ("faults served", ", ".join(f"{k} {v}" for k, v in sorted(self.served.items()))),
            ("wall time", f"{self.elapsed_s:.1f} s"),
        ]
        return "\n".join(["| figure | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])


class LedgerWorker:
    """Counts every call made through a Worker and the status it ended with (the client's account)."""

    def __init__(self, inner, ledger: list[tuple[str, CallResult]]) -> None:
        self.inner = inner
        self.name = inner.name
        self.ledger = ledger

    async def call(self, request: CallRequest) -> CallResult:
        result = await self.inner.call(request)
        self.ledger.append((self.name, result))
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


def write_pool_file(path: Path, endpoint: str, *, name: str = "soak-pool", api_key_env: str | None = None,
                    seats: tuple[str, ...] = SEATS, concurrency: int = SEAT_CONCURRENCY,
                    timeout_s: float = SEAT_TIMEOUT_S, retry: dict | None = None) -> Path:
    """A pool YAML of `openai` seats on one endpoint, as a user would write it."""
    pool = {
        "name": name,
        "description": "openai seats on the fault-injecting server",
        "governor": {"max_in_flight": 64},
        "retry": retry or RETRY,
        "workers": [
            {
                "name": seat, "backend": "openai", "model": f"fault-{seat}", "endpoint": endpoint,
                "description": f"seat {seat} on the fault server", "max_tokens": 256,
                "concurrency": concurrency, "timeout_s": timeout_s, "price_input_per_mtok": 1.0,
                "price_output_per_mtok": 2.0, **({"api_key_env": api_key_env} if api_key_env else {}),
            }
            for seat in seats
        ],
    }
    path.write_text(yaml.safe_dump(pool, sort_keys=False))
    return path


def synthetic_questions(n: int, prefix: str = "soak", corpus: str = "gsm8k") -> list[Question]:
    """`n` questions whose gold is 42 (what the fault server's ok answers box)."""
    return [
        Question(question_id=f"{prefix}:test:{i}", corpus=corpus, split="test",
                 problem=f"Problem {i}: what is 6 times 7?", answer="42")
        for i in range(n)
    ]


def conductor_texts(orchestrator: Orchestrator, n: int, seed: int) -> list[str]:
    """Conductor outputs: 1-3 step workflows in the displayed names, a few unparseable ones."""
    rng = random.Random(seed)
    names = orchestrator.displayed_names
    texts = []
    for _ in range(n):
        if rng.random() < UNPARSEABLE_SHARE:
            texts.append("I would route this to the strongest model, but I forgot the lists.")
            continue
        steps = tuple(
            Step(rng.choice(names), f"Part {k}: solve it and box the answer.", tuple(range(k)) if k else ())
            for k in range(rng.randint(1, 3))
        )
        texts.append("Reasoning first.\n" + render_workflow(Workflow(steps), names))
    return texts


async def _soak(pool: PoolConfig, warehouse: Warehouse, questions: list[Question], n_workflows: int,
                ledger: list[tuple[str, CallResult]], seed: int) -> None:
    client = shared_http_client(pool.governor.max_in_flight)
    workers = {name: LedgerWorker(w, ledger) for name, w in build_workers(pool, client=client).items()}
    governor = Governor.from_pool(pool)
    try:
        await run_probes(warehouse, pool, workers, questions, samples=PROBE_SAMPLES, temperature=0.2,
                         run_id="soak-probe", governor=governor, batch_size=250)
        orchestrator = Orchestrator(pool, workers, governor, warehouse)
        texts = conductor_texts(orchestrator, n_workflows, seed)
        await asyncio.gather(*(
            orchestrator.run_workflow_text(questions[i % len(questions)], text, conductor_name="soak-conductor",
                                           run_id="soak-workflows", repeat=i // len(questions))
            for i, text in enumerate(texts)
        ))
        await orchestrator.aclose()
    finally:
        await client.aclose()


def run_soak(workdir: Path, *, n_questions: int = 600, n_workflows: int = 1100, seed: int = 7) -> SoakFigures:
    """Run the soak in `workdir` (pool file, warehouse) and reconcile every call."""
    faults = FaultRates.spread(FAULT_RATE, ALL_FAULT_KINDS)
    warehouse = Warehouse(workdir / "soak.duckdb")
    questions = synthetic_questions(n_questions)
    warehouse.insert("questions", questions)
    ledger: list[tuple[str, CallResult]] = []
    started = time.monotonic()
    with FaultServer(latency_s=0.002, faults=faults, retry_after_s=0.05, hang_s=5.0, seed=seed) as server:
        pool = load_pool(write_pool_file(workdir / "soak-pool.yaml", server.base_url))
        asyncio.run(_soak(pool, warehouse, questions, n_workflows, ledger, seed))
        served = server.stats()
    elapsed = time.monotonic() - started

    calls = warehouse.query(
        "SELECT call_id, kind, status, correct, attempts FROM calls WHERE run_id IN ('soak-probe', 'soak-workflows')"
    )
    n_workflow_rows = warehouse.query("SELECT count(*) AS n FROM workflows WHERE run_id = 'soak-workflows'")["n"][0]
    probe_keys = {probe_call_id(pool.name, q.question_id, w, s)
                  for q in questions for w in pool.worker_names for s in range(PROBE_SAMPLES)}
    ledger_statuses = Counter(str(result.status) for _, result in ledger)
    row_statuses = Counter(calls["status"].to_list())
    attempts = [result.attempts for _, result in ledger]
    probe_rows = calls.filter(calls["kind"] == "probe")
    distinct_rows = calls["call_id"].n_unique()
    # Per status, rows the ledger has and the warehouse lacks (lost) or has in excess (duplicated).
    lost = sum(max(0, ledger_statuses[s] - row_statuses[s]) for s in ledger_statuses)
    duplicated = (calls.height - distinct_rows) + sum(
        max(0, row_statuses[s] - ledger_statuses[s]) for s in row_statuses
    )
    return SoakFigures(
        calls_issued=len(ledger),
        probe_calls=probe_rows.height,
        step_calls=calls.height - probe_rows.height,
        workflows=n_workflows,
        attempts_sent=served.total_requests,
        calls_retried=sum(a > 1 for a in attempts),
        retries=sum(a - 1 for a in attempts),
        scored=int(calls["correct"].is_not_null().sum()),
        excluded=int((calls["status"] == CallStatus.TRANSIENT.value).sum()),
        rows_calls=calls.height,
        rows_workflows=int(n_workflow_rows),
        lost=lost,
        duplicated=duplicated,
        missing_probe_keys=len(probe_keys - set(probe_rows["call_id"].to_list())),
        status_counts=dict(row_statuses),
        served={k: v for k, v in served.served.items() if v},
        elapsed_s=elapsed,
    )


def update_results(section: str, body: str, path: Path = RESULTS_FILE) -> None:
    """Replace the text between `<!-- section:start -->` and `<!-- section:end -->` (append if absent)."""
    start, end = f"<!-- {section}:start -->", f"<!-- {section}:end -->"
    text = path.read_text() if path.exists() else "# Reliability results\n"
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=600)
    parser.add_argument("--workflows", type=int, default=1100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS-reliability.md alone")
    args = parser.parse_args(argv)
    logging.getLogger("conductor_pipeline").setLevel(logging.ERROR)  # per-retry warnings would drown the table
    with tempfile.TemporaryDirectory() as tmp:
        figures = run_soak(Path(tmp), n_questions=args.questions, n_workflows=args.workflows, seed=args.seed)
    print(figures.table())
    print(asdict(figures))
    ok = figures.lost == 0 and figures.duplicated == 0 and figures.missing_probe_keys == 0
    print("RESULT:", "every call accounted for" if ok else "ACCOUNTING MISMATCH")
    if not args.no_write:
        update_results("soak", "## Soak (benchmarks/soak.py)\n\n"
                       f"{len(SEATS)} `openai` seats on the fault server, {FAULT_RATE:.0%} faults spread over "
                       f"{', '.join(k.value for k in ALL_FAULT_KINDS)}; retry budget {RETRY['max_attempts']} "
                       f"attempts; {args.questions} questions x {PROBE_SAMPLES} samples probed, then "
                       f"{args.workflows} workflows of 1-3 steps.\n\n" + figures.table())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
