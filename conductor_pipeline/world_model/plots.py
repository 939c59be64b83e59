"""The world model's plots: a reliability diagram per split."""

from __future__ import annotations

from collections.abc import Sequence

from conductor_pipeline.plotting import figure_png, pyplot
from conductor_pipeline.world_model.metrics import SplitReport


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
