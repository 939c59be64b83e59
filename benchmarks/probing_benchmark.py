"""Probing throughput: OpenAICompatWorker through the Governor vs the official `openai` client.

Against the fault server (its own process, no faults) answering every request after a fixed
latency L, a closed loop of C concurrent callers can at best finish C/L requests per second.
For each C this prints the sustained throughput of

  (a) ours:     OpenAICompatWorker (one shared httpx client) inside `Governor.slot`, and
  (b) baseline: `openai.AsyncOpenAI().chat.completions.create` under an `asyncio.Semaphore(C)`,

each as a fraction of C/L, and their ratio. Targets: (a) >= 90% of ideal at C=64, and (a) no
slower than (b). Each measurement runs `rounds` x C requests after one unmeasured warm-up round
(connections opened), in a fresh event loop.

    .venv/bin/python -m benchmarks.probing_benchmark [--latency 0.5] [--rounds 6] [--concurrency 8 64 256]

"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import openai

from tests.fakes import FaultServer
from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker, shared_http_client
from conductor_pipeline.pools.config import RetryConfig, WorkerSeat
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import CallRequest, CallStatus, ChatMessage, Question

MODEL = "bench-model"
MESSAGES = ({"role": "user", "content": "What is 6 times 7? Put the answer in \\boxed{}."},)
REQUEST = CallRequest(
    question=Question(question_id="bench", corpus="math", split="test", problem="6*7", answer="42"),
    messages=tuple(ChatMessage(m["role"], m["content"]) for m in MESSAGES),
    max_tokens=256,
)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(call: Callable[[], Awaitable[bool]], n: int) -> tuple[float, int]:
    """Run `n` calls (each already gated by its own limiter); seconds taken and failures."""
    t0 = time.perf_counter()
    outcomes = await asyncio.gather(*(call() for _ in range(n)))
    return time.perf_counter() - t0, outcomes.count(False)


async def measure_ours(base_url: str, concurrency: int, rounds: int) -> tuple[float, int]:
    seat = WorkerSeat(name="bench", backend="openai", model=MODEL, description="benchmark seat",
                      endpoint=base_url, max_tokens=256, concurrency=concurrency, timeout_s=60)
    governor = Governor(max_in_flight=concurrency, per_worker={seat.name: concurrency})
    client = shared_http_client(concurrency)
    worker = OpenAICompatWorker(seat, RetryConfig(max_attempts=1), client=client)

    async def one() -> bool:
        async with governor.slot(seat.name):
            return (await worker.call(REQUEST)).status is CallStatus.OK

    await drive(one, concurrency)  # warm-up: open the connections
    elapsed, failures = await drive(one, concurrency * rounds)
    await client.aclose()
    return elapsed, failures


async def measure_openai(base_url: str, concurrency: int, rounds: int) -> tuple[float, int]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench-key", max_retries=0, timeout=60)
    semaphore = asyncio.Semaphore(concurrency)

    async def one() -> bool:
        async with semaphore:
            completion = await client.chat.completions.create(model=MODEL, messages=list(MESSAGES), max_tokens=256)
            return bool(completion.choices[0].message.content)

    await drive(one, concurrency)
    elapsed, failures = await drive(one, concurrency * rounds)
    await client.close()
    return elapsed, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.5, help="server latency L in seconds")
    parser.add_argument("--rounds", type=int, default=6, help="measured requests per caller")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per cell (median reported)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 64, 256])
    args = parser.parse_args()

    print(f"server latency L = {args.latency}s; {args.rounds} rounds x C requests per measurement; "
          f"median of {args.repeats}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'C':>5} {'ideal/s':>8} {'ours/s':>7} {'ours/ideal':>10} {'openai/s':>9} {'openai/ideal':>12} "
          f"{'ours/openai':>11} {'cpu ms/req ours':>15} {'openai':>7} {'server':>7} {'fail':>5}")
    with FaultServer(latency_s=args.latency) as server:
        assert server.pid is not None
        for concurrency in args.concurrency:
            n = concurrency * args.rounds
            ideal = concurrency / args.latency
            rates: dict[str, list[float]] = {"ours": [], "openai": []}
            client_cpu: dict[str, list[float]] = {"ours": [], "openai": []}
            server_cpu: list[float] = []
            failures = 0
            for _ in range(args.repeats):  # interleaved, so drift on a shared box hits both alike
                for name, measure in (("ours", measure_ours), ("openai", measure_openai)):
                    cpu0, server0 = time.process_time(), process_cpu_s(server.pid)
                    elapsed, failed = asyncio.run(measure(server.base_url, concurrency, args.rounds))
                    client_cpu[name].append((time.process_time() - cpu0) / (n + concurrency) * 1e3)
                    server_cpu.append((process_cpu_s(server.pid) - server0) / (n + concurrency) * 1e3)
                    rates[name].append(n / elapsed)
                    failures += failed
            ours, base = statistics.median(rates["ours"]), statistics.median(rates["openai"])
            print(f"{concurrency:>5} {ideal:>8.1f} {ours:>7.1f} {ours / ideal:>10.1%} {base:>9.1f} "
                  f"{base / ideal:>12.1%} {ours / base:>11.2f} {statistics.median(client_cpu['ours']):>15.2f} "
                  f"{statistics.median(client_cpu['openai']):>7.2f} {statistics.median(server_cpu):>7.2f} "
                  f"{failures:>5}", flush=True)
        peak = server.stats().peak_in_flight
    print(f"server peak in flight: {peak}; cpu ms/req counts warm-up requests and client set-up")


if __name__ == "__main__":
    main()
