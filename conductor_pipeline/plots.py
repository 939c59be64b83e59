"""Every plot the pipeline publishes, as PNG bytes: the assets put them inline in the Dagster UI.

One module so the matplotlib setup (headless Agg backend, one DPI, figures always closed) is written
once; each function takes plain frames or reports from the library and returns PNG bytes.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from conductor_pipeline.training.gates import running_mean, step_flat_fraction, step_same_correctness

if TYPE_CHECKING:
    from conductor_pipeline.world_model.metrics import SplitReport

# 80 dpi left 7-pt tick labels unreadable in the UI; 110 keeps them sharp at a modest size.
PLOT_DPI = 110

# Pass-rate histogram bins: 11 bins so that k/10 sample fractions land in their own bin.
PASS_RATE_BINS = np.linspace(0.0, 1.0, 12)


def pyplot():
    """matplotlib.pyplot on the headless Agg backend (imported on first use: plotting is rare)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def figure_png(figure, *, tight_bbox: bool = False) -> bytes:
    """Render a matplotlib figure to PNG bytes and close it (figures left open leak memory)."""
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=PLOT_DPI, bbox_inches="tight" if tight_bbox else None)
    pyplot().close(figure)
    return buffer.getvalue()


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


def _code_rates(frame: pl.DataFrame) -> dict[str, list[float]]:
    """Per parse failure code: its share of scored rollouts at each step (from the JSON tallies)."""
    tallies = [json.loads(raw) if raw else {} for raw in frame["parse_codes"].to_list()]
    codes = sorted({c for t in tallies for c in t} - {"ok", "infrastructure"})
    totals = [sum(n for c, n in t.items() if c != "infrastructure") or 1 for t in tallies]
    return {code: [t.get(code, 0) / total for t, total in zip(tallies, totals, strict=True)] for code in codes}


def training_curves_png(
    frame: pl.DataFrame,
    title: str,
    threshold: float | None = None,
    final_workers: pl.DataFrame | None = None,
    halves: tuple[Mapping[str, object], Mapping[str, object]] | None = None,
    fan_out: pl.DataFrame | None = None,
) -> bytes:
    """PNG: reward mean +- std; groups without signal (per step, and the running figure the gate
    judges); parse-failure rate by code; completion length; and, given `final_workers` (rollouts
    per step and final worker), the share of rollouts ending at each worker, beside `halves` (the
    first and second half of the steps: parse_fail_rate, reward_mean, same_correctness, and
    fan_out_share where the pool has an aggregator). `fan_out` (step, rollouts, fan_out) draws the
    share of rollouts that fanned out and aggregated over the final-worker shares."""
    plt = pyplot()
    steps = frame["step"].to_numpy()

    def column(name: str):
        return frame[name].cast(pl.Float64).fill_null(float("nan")).to_numpy()

    rows = 3 if final_workers is not None and final_workers.height else 2
    figure, axes = plt.subplots(rows, 2, figsize=(9, 2.75 * rows))
    for axis in list(axes.flat)[1:5] + ([axes[2, 0]] if rows == 3 else []):
        axis.sharex(axes[0, 0])  # every panel but the halves' plots steps
    reward, std = column("reward_mean"), column("reward_std")
    axes[0, 0].plot(steps, reward, marker=".", color="#4472c4")
    axes[0, 0].fill_between(steps, reward - std, reward + std, alpha=0.2, color="#4472c4")
    axes[0, 0].set_title("reward (mean +- std over rollouts)", fontsize=9)
    _gate_panel(axes[0, 1], frame, steps, threshold)
    axes[1, 0].plot(steps, column("parse_fail_rate"), marker=".", color="black", label="all codes")
    for code, rates in _code_rates(frame).items():
        axes[1, 0].plot(steps, rates, linewidth=1, label=code)
    axes[1, 0].set_title("parse-failure rate by code", fontsize=9)
    axes[1, 0].set_ylim(-0.02, 1.02)
    axes[1, 0].legend(fontsize=6)
    axes[1, 1].plot(steps, column("completion_length"), marker=".", color="#548235")
    axes[1, 1].set_title("mean completion length (tokens)", fontsize=9)
    if rows == 3:
        _final_worker_panel(axes[2, 0], final_workers, fan_out)
        _halves_panel(axes[2, 1], halves)
    for axis in axes.flat:
        axis.tick_params(labelsize=7)
    figure.supxlabel("step", fontsize=8)
    figure.suptitle(title, fontsize=10)
    return figure_png(figure)


def _gate_panel(axis, frame: pl.DataFrame, steps, threshold: float | None) -> None:
    """Per-step shares of groups without signal (faint: a step holds few groups, so they jump
    between a handful of values) and their running means, the figures the gate judges."""
    rows = list(frame.iter_rows(named=True))
    flat = [step_flat_fraction(row) for row in rows]
    same = [step_same_correctness(row) for row in rows]
    axis.plot(steps, flat, linestyle="none", marker=".", alpha=0.35, color="#c00000")
    axis.plot(steps, _nan(running_mean(flat)), color="#c00000", label="equal rewards (running)")
    if any(v is not None for v in same):
        axis.plot(steps, _nan(same), linestyle="none", marker="x", markersize=3, alpha=0.35, color="#7030a0")
        axis.plot(steps, _nan(running_mean(same)), color="#7030a0", linestyle="--", label="same correctness (running)")
    if threshold is not None:
        axis.axhline(threshold, linestyle=":", color="grey", label=f"gate: < {threshold:.2f}")
    group = frame["group_size"].drop_nulls()
    axis.set_title(f"groups without signal (group size {group[0] if len(group) else '?'})", fontsize=9)
    axis.set_ylim(-0.02, 1.02)
    axis.legend(fontsize=6)


def _final_worker_panel(axis, final_workers: pl.DataFrame, fan_out: pl.DataFrame | None = None) -> None:
    """Stacked shares of each step's rollouts by the worker whose answer was final, and the share
    that fanned out and aggregated (a line) where the pool has an aggregator."""
    table = final_workers.pivot(on="final_worker", index="step", values="rollouts").fill_null(0).sort("step")
    workers = [c for c in table.columns if c != "step"]
    counts = np.array([table[w].to_numpy() for w in workers], dtype=float)
    shares = counts / np.maximum(counts.sum(axis=0), 1)
    axis.stackplot(table["step"].to_numpy(), shares, labels=workers, alpha=0.85)
    if fan_out is not None and fan_out.height:
        share = fan_out["fan_out"].cast(pl.Float64) / fan_out["rollouts"].cast(pl.Float64).clip(lower_bound=1)
        axis.plot(fan_out["step"].to_numpy(), share.to_numpy(), color="black", marker=".", label="fan out + aggregate")
    axis.set_title("share of rollouts ending at each worker", fontsize=9)
    axis.set_ylim(0, 1)
    axis.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _halves_panel(axis, halves: tuple[Mapping[str, object], Mapping[str, object]] | None) -> None:
    """The run's first half of steps beside its second: parse failures, reward, flat-correctness groups."""
    if halves is None:
        axis.axis("off")
        return
    figures = [("parse failures", "parse_fail_rate"), ("mean reward", "reward_mean"), ("no routing signal", "same_correctness")]
    if any(half.get("fan_out_share") is not None for half in halves):
        figures.append(("fan out", "fan_out_share"))
    positions = np.arange(len(figures))
    for offset, (label, half) in zip((-0.2, 0.2), (("first half", halves[0]), ("second half", halves[1])), strict=True):
        values = [half.get(key) for _, key in figures]
        axis.bar(positions + offset, [float("nan") if v is None else v for v in values], width=0.4, label=label)
    axis.set_xticks(positions, [label for label, _ in figures], fontsize=7)
    axis.set_ylim(0, 1.05)
    axis.set_title("first half of the steps against the second", fontsize=9)
    axis.legend(fontsize=6)


def _nan(values) -> list[float]:
    return [float("nan") if v is None else v for v in values]


def sft_loss_png(history: list[dict]) -> bytes | None:
    points = [(h["step"], h["loss"]) for h in history if "loss" in h and "step" in h]
    if not points:
        return None
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(5, 3))
    axis.plot(*zip(*points, strict=True), marker=".")
    axis.set_xlabel("step")
    axis.set_ylabel("SFT loss (workflow tokens)")
    axis.set_title("warm start: supervised loss", fontsize=9)
    return figure_png(figure)


# Distinct marker per arm, and a colour per arm from tab20 (dark shades first, then light).
ARM_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")
# Arms at the same point (best_single and its solo arm) are drawn side by side, this far apart.
COINCIDENT_DODGE_POINTS = 7.0


def arm_colour(plt, index: int):
    """A qualitative colour per arm: the 10 dark tab20 shades, then the 10 light ones."""
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return plt.get_cmap("tab20")(order[index % 20])


def accuracy_cost_plot(
    table: pl.DataFrame,
    *,
    frontier: Sequence[str] = (),
    sweep: pl.DataFrame | None = None,
    labels: Mapping[str, str] | None = None,
    reference: str | None = None,
) -> bytes:
    """PNG: accuracy (95% interval) against cost per question, one colour and marker per arm, named in a
    legend beside the axes (labels on the points overprinted each other; coincident arms are dodged
    a few points sideways); the frontier as a dashed line; `sweep` rows (router, accuracy,
    cost_per_question) as thin curves; the `reference` arm's accuracy, cost and half its cost as guides."""
    from matplotlib.transforms import offset_copy  # noqa: PLC0415

    plt = pyplot()
    labels = labels or {}
    figure, axis = plt.subplots(figsize=(9.5, 5.2))
    points: dict[str, tuple[float, float]] = {}
    seen: dict[tuple[float, float], int] = {}
    for index, row in enumerate(table.iter_rows(named=True)):
        cost = row["cost_per_question"] or 0.0
        points[row["arm"]] = (cost, row["accuracy"])
        place = (round(cost, 12), round(row["accuracy"], 12))
        dodge = seen.get(place, 0)
        seen[place] = dodge + 1
        axis.errorbar(
            cost, row["accuracy"], yerr=[[row["accuracy"] - row["ci_low"]], [row["ci_high"] - row["accuracy"]]],
            fmt=ARM_MARKERS[index % len(ARM_MARKERS)], color=arm_colour(plt, index), capsize=3, markersize=7,
            label=labels.get(row["arm"], row["arm"]),
            transform=offset_copy(axis.transData, fig=figure, x=dodge * COINCIDENT_DODGE_POINTS, units="points"),
        )
    shown = [arm for arm in frontier if arm in points]
    if len(shown) > 1:
        axis.plot(*zip(*(points[a] for a in shown), strict=True), linestyle="--", color="black", linewidth=1,
                  label="frontier (no arm as accurate for less)")
    if sweep is not None and sweep.height:
        for router, style in zip(sorted(set(sweep["router"].to_list())), (":", "-."), strict=False):
            rows = sweep.filter(pl.col("router") == router).sort("cost_per_question")
            axis.plot(rows["cost_per_question"].to_list(), rows["accuracy"].to_list(), linestyle=style, marker=".",
                      markersize=3, linewidth=1, color="grey", label=f"{router} sweep (from solo recordings)")
    if reference in points:
        cost, accuracy = points[reference]
        axis.axhline(accuracy, color="grey", linewidth=0.6)
        if cost > 0:
            axis.axvline(cost, color="grey", linewidth=0.6)
            axis.axvline(cost / 2, color="grey", linewidth=0.6, linestyle=":")
    # Limits by hand: points drawn with a dodge transform do not take part in autoscaling.
    positive = [c for c, _ in points.values() if c > 0]
    margin = max(positive, default=1.0) * 0.05
    if positive and max(positive) / min(positive) > 20:  # cheap and dear arms differ by orders of magnitude
        axis.set_xscale("symlog", linthresh=min(positive))
        margin = min(positive) * 0.2
        # 0, then whole decades: a decade tick inside the linear stretch would sit on top of the 0.
        decades = range(math.ceil(math.log10(min(positive))), math.ceil(math.log10(max(positive) * 1.6)) + 1)
        axis.set_xticks([0.0, *(10.0**k for k in decades)])
    axis.set_xlim(-margin, max(positive, default=1.0) * 1.6)
    if table.height:
        axis.set_ylim(max(-0.02, min(table["ci_low"]) - 0.04), min(1.02, max(table["ci_high"]) + 0.04))
    axis.set_xlabel("cost per question (USD" + (", estimated; " if _estimated(table) else "; ")
                    + "grey lines: best single's accuracy, cost and half its cost)")
    axis.set_ylabel("accuracy (share correct, 95% CI)")
    axis.set_title(f"accuracy vs cost per arm ({table['n_label'][0] if table.height else 'no rows'})", fontsize=9)
    axis.grid(alpha=0.3)
    if table.height:
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return figure_png(figure, tight_bbox=True)


def _estimated(table: pl.DataFrame) -> bool:
    return "tokens_estimated" in table.columns and bool(table["tokens_estimated"].fill_null(False).any())


def running_gap_plot(gap: pl.DataFrame) -> bytes:
    """PNG: each arm's gap to the best solo worker at every 25-question boundary."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(8.0, 4.5))
    for arm in sorted(gap["arm"].unique().to_list()) if gap.height else []:
        rows = gap.filter(pl.col("arm") == arm).sort("n")
        axis.plot(rows["n"].to_list(), rows["gap"].to_list(), marker="o", markersize=3, label=arm)
    axis.axhline(0.0, color="grey", linewidth=0.8)
    axis.set_xlabel("questions scored (slice order)")
    axis.set_ylabel("accuracy gap to best solo worker")
    axis.set_title("running gap to the best single worker (0 = as good as the best worker alone)", fontsize=9)
    axis.grid(alpha=0.3)
    if gap.height:  # outside the axes: inside, eleven arms' legend covered the curves
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return figure_png(figure, tight_bbox=True)


def reliability_png(splits: Sequence[SplitReport]) -> bytes:
    """A reliability diagram per split (matplotlib Agg), as PNG bytes for the UI."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(splits), figsize=(5.5 * len(splits), 5), squeeze=False)
    for axis, split in zip(axes[0], splits):
        axis.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
        for model, (mean_p, observed, count) in split.reliability.items():
            shown = count > 0
            axis.plot(mean_p[shown], observed[shown], marker="o", markersize=3, label=model)
        axis.set_title(f"{split.name} (out of fold)")
        axis.set_xlabel("predicted P(success)")
        axis.set_ylabel("observed success rate")
        axis.legend(fontsize=7, loc="upper left")
    return figure_png(fig)
