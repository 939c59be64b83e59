"""Pass rates per question x worker and per-worker summaries, with 95% intervals.

Everything downstream of probing (contested set, world-model baselines, gates) reads these two
tables, so they are computed in one place from sql/pass_rates.sql and sql/worker_summary.sql.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from conductor_pipeline.grading.regrade import require_current_grades
from conductor_pipeline.stats import wilson_interval
from conductor_pipeline.warehouse import Warehouse

# Pass-rate histogram bins: 11 bins so that k/10 sample fractions land in their own bin.
PASS_RATE_BINS = np.linspace(0.0, 1.0, 12)


def with_interval(frame: pl.DataFrame, successes: str, trials: str, prefix: str) -> pl.DataFrame:
    """Add `<prefix>_low` / `<prefix>_high`: the Wilson 95% interval of successes / trials."""
    low, high = wilson_interval(frame[successes].to_numpy(), frame[trials].to_numpy())
    return frame.with_columns(pl.Series(f"{prefix}_low", low), pl.Series(f"{prefix}_high", high))


def pass_rate_table(warehouse: Warehouse, pool: str) -> pl.DataFrame:
    """question_id, worker, samples, successes, pass_rate, pass_rate_low, pass_rate_high.

    Raises `StaleGradesError` when the pool holds verdicts of an older grader.
    """
    require_current_grades(warehouse, pool=pool)
    frame = warehouse.query_file("pass_rates", {"pool": pool})
    return with_interval(frame, "successes", "samples", "pass_rate")


def worker_summary(warehouse: Warehouse, pool: str, kind: str = "probe") -> pl.DataFrame:
    """Per worker: marginal accuracy with its interval, status rates, mean tokens, cost, latency."""
    frame = warehouse.query_file("worker_summary", {"pool": pool, "kind": kind})
    return with_interval(frame.with_columns(pl.col("accuracy").fill_null(float("nan"))), "successes", "scored", "accuracy")
