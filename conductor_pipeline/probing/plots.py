"""Probing's plots: what each worker finds easy, hard, or a coin flip."""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl

from conductor_pipeline.plotting import figure_png, pyplot
from conductor_pipeline.probing.pass_rates import PASS_RATE_BINS


def pass_rate_plot(rates: pl.DataFrame, workers: Sequence[str], title: str) -> bytes:
    """PNG: one pass-rate histogram per worker (the questions each finds easy, hard, or a coin flip)."""
    plt = pyplot()
    columns = min(3, max(1, len(workers)))
    rows = math.ceil(len(workers) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.4 * rows), squeeze=False, sharex=True)
    for axis, worker in zip(axes.flat, workers):
        values = rates.filter(pl.col("worker") == worker)["pass_rate"].to_numpy()
        axis.hist(values, bins=PASS_RATE_BINS, color="#4472c4", edgecolor="white")
        mean = values.mean() if len(values) else float("nan")
        axis.set_title(f"{worker} (mean {mean:.2f}, n={len(values)})", fontsize=8)
        axis.tick_params(labelsize=7)
    for axis in list(axes.flat)[len(workers):]:
        axis.axis("off")
    figure.supxlabel("pass rate per question", fontsize=8)
    figure.supylabel("questions", fontsize=8)
    figure.suptitle(title, fontsize=9)
    return figure_png(figure)
