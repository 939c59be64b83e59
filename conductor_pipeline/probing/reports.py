"""What probing measured, as the markdown tables the Dagster UI renders next to each probing asset.

Every function takes the library's own results (a probe summary, the pass-rate and worker-summary
frames, the ceiling table) and returns GitHub markdown, so the asset modules only attach them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl
from tabulate import tabulate

from conductor_pipeline.probing.pass_rates import PASS_RATE_BINS
from conductor_pipeline.records import CallStatus

# Column order of every per-status table: the order the statuses are declared in.
STATUSES = tuple(status.value for status in CallStatus)
MISSING = "-"  # a cell with no value (no scored call, no null pool)


def _number(value: object, digits: int = 3) -> object:
    """A float rounded for a table cell; None and NaN show as MISSING; anything else as is."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return round(value, digits) if isinstance(value, float) else value


def _percent(value: float | None) -> str:
    return MISSING if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def status_count_markdown(per_worker: Mapping[str, Mapping[str, int]]) -> str:
    """Per worker, how many calls of one probe run ended in each status, and their total."""
    rows = [[w, *(counts.get(s, 0) for s in STATUSES), sum(counts.values())] for w, counts in per_worker.items()]
    return tabulate(rows, headers=["worker", *STATUSES, "total"], tablefmt="github")


def accuracy_markdown(summary: pl.DataFrame) -> str:
    """Per worker (a `worker_summary` frame): accuracy with its Wilson interval, tokens, cost, latency."""
    rows = [
        [
            r["worker"],
            r["scored"],
            _number(r["accuracy"]),
            f"[{_number(r['accuracy_low'])}, {_number(r['accuracy_high'])}]",
            _number(r["mean_prompt_tokens"], 0),
            _number(r["mean_completion_tokens"], 0),
            "est." if r["tokens_estimated"] else "reported",
            _number(r["total_cost_usd"], 4),
            _number(r["mean_latency_s"], 2),
        ]
        for r in summary.iter_rows(named=True)
    ]
    headers = ["worker", "scored calls", "accuracy", "95% CI (Wilson)", "mean prompt tokens",
               "mean completion tokens", "token counts (est. = estimated)", "total cost (USD)", "mean latency (s)"]
    return tabulate(rows, headers=headers, tablefmt="github")


def status_rate_markdown(summary: pl.DataFrame) -> str:
    """Per worker, the share of calls in each status (percent of that worker's calls, not counts)."""
    rows = [[r["worker"], r["calls"], *(_percent(r[f"{s}_rate"]) for s in STATUSES)] for r in summary.iter_rows(named=True)]
    return tabulate(rows, headers=["worker", "calls", *(f"{s} %" for s in STATUSES)], tablefmt="github")


def worker_pass_rate_histogram_markdown(rates: pl.DataFrame, workers: Sequence[str]) -> str:
    """Per worker, how many questions fall in each pass-rate bin (the bins of the pass-rate plot).

    Each worker's own distribution, one row per worker; `contested.pass_rate_histogram` is the
    other view: questions per band of the pool's mean pass rate.
    """
    rows = []
    for worker in workers:
        values = rates.filter(pl.col("worker") == worker)["pass_rate"].to_numpy()
        counts, _ = np.histogram(values, bins=PASS_RATE_BINS)
        rows.append([worker, *counts.tolist()])
    headers = ["worker", *(f"{lo:.2f}-{hi:.2f}" for lo, hi in zip(PASS_RATE_BINS[:-1], PASS_RATE_BINS[1:]))]
    return tabulate(rows, headers=headers, tablefmt="github")


def ceilings_markdown(table: pl.DataFrame) -> str:
    """The ceiling table (`ceilings.pool_ceilings`): one row per (sub-, null) pool."""
    rows = [
        [r["row"], r["size"], r["n_questions"], r["best_worker"], _number(r["best_single"]), _number(r["oracle"]),
         _number(r["headroom"]), r["unsolved"], r["workers"]]
        for r in table.iter_rows(named=True)
    ]
    headers = ["pool", "size", "questions", "best worker", "best single", "oracle", "headroom", "unsolved", "workers"]
    return tabulate(rows, headers=headers, tablefmt="github")


def null_pool_note(pool: Mapping[str, object], widest_null: Mapping[str, object] | None) -> str:
    """How to read the pool's headroom against the widest null pool's (or why there is none)."""
    if widest_null is None:
        return (
            "No worker has more than one scored sample per question (e.g. ZeroEval replay records one), so no "
            "null pool can be shown: part of this headroom may be sampling noise that routing cannot exploit."
        )
    return (
        f"Null pool: {widest_null['size']} independent samples of {widest_null['best_worker']} alone show "
        f"{_number(widest_null['headroom'])} headroom, against {_number(pool['headroom'])} for the real pool. Headroom "
        "not above the null pool's is what resampling one model fakes, not routing signal."
    )
