"""The evaluation's plots: accuracy against cost per arm, and each arm's running gap to the best
single worker."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import polars as pl

from conductor_pipeline.plotting import figure_png, pyplot

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
