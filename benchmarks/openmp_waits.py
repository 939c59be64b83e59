"""How a LightGBM fit with the W's two threads fares when another process holds a core.

    .venv/bin/python -m benchmarks.openmp_waits [--repeats 3] [--rounds 200]

GNU OpenMP's waiting threads spin by default. The world model's settings pass `num_threads: 2`
to LightGBM, so on a 2-core machine a fit shares its cores with whatever else runs (another xdist
worker, another Dagster step). This fits one synthetic frame (20,000 rows x 30 features, the seed
fixed) in a fresh process per run, under three settings, on a quiet machine and with a busy loop
holding one core, and prints the median times with their ratios against the default. The
predictions of each setting are printed too: the wait policy must not change them. The figures
of 2026-12-07 are in docs/LOG.md ("seventh").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

FIT = """
import sys, time
import lightgbm as lgb
import numpy as np
threads, rounds = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
features = rng.normal(size=(20_000, 30))
labels = (features[:, 0] + rng.normal(size=20_000) > 0).astype(float)
params = {"objective": "binary", "num_threads": threads, "deterministic": True, "verbose": -1, "seed": 0,
          "num_leaves": 31, "min_data_in_leaf": 40}
start = time.perf_counter()
booster = lgb.train(params, lgb.Dataset(features, labels), num_boost_round=rounds)
seconds = time.perf_counter() - start
print(seconds, *booster.predict(features[:3], num_threads=1))
"""
SETTINGS = {
    "2 threads, default waits": ("2", {}),
    "2 threads, OMP_WAIT_POLICY=PASSIVE": ("2", {"OMP_WAIT_POLICY": "PASSIVE"}),
    "1 thread": ("1", {}),
}


def fit(threads: str, extra_env: dict[str, str], rounds: int) -> tuple[float, tuple[str, ...]]:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run(
        [sys.executable, "-c", FIT, threads, str(rounds)], env={**env, **extra_env},
        check=True, capture_output=True, text=True,
    ).stdout.split()
    return float(out[0]), tuple(out[1:])


def measure(repeats: int, rounds: int) -> dict[str, tuple[float, tuple[str, ...]]]:
    results: dict[str, list[float]] = {name: [] for name in SETTINGS}
    predictions: dict[str, tuple[str, ...]] = {}
    for _ in range(repeats):  # interleaved, so the machine's drift touches every setting alike
        for name, (threads, extra_env) in SETTINGS.items():
            seconds, predictions[name] = fit(threads, extra_env, rounds)
            results[name].append(seconds)
    return {name: (statistics.median(times), predictions[name]) for name, times in results.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)
    print("| machine | setting | median s | vs default waits | predictions of 3 rows |")
    print("|---|---|---:|---:|---|")
    for machine in ("quiet", "one core held by a busy loop"):
        busy = None
        if machine != "quiet":
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        try:
            medians = measure(args.repeats, args.rounds)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        baseline = medians["2 threads, default waits"][0]
        for name, (seconds, predictions) in medians.items():
            print(f"| {machine} | {name} | {seconds:.2f} | {baseline / seconds:.2f}x | {' '.join(predictions)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
