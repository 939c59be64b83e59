"""Training's plots: a GRPO run's curves (reward, groups without signal, parse failures, length,
final workers) and the warm start's supervised loss."""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import polars as pl

from conductor_pipeline.plotting import figure_png, pyplot
from conductor_pipeline.training.gates import running_mean, step_flat_fraction, step_same_correctness


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
