"""The matplotlib preamble every stage's plots share: the headless Agg backend, one DPI, and
figures always rendered to PNG bytes and closed (the assets put the PNGs inline in the Dagster UI).

Each stage draws its own figures next to its code (`probing.plots`, `training.plots`,
`evaluation.plots`, `world_model.plots`); each function there takes plain frames or reports from
the library and returns PNG bytes.
"""

from __future__ import annotations

import io

# 80 dpi left 7-pt tick labels unreadable in the UI; 110 keeps them sharp at a modest size.
PLOT_DPI = 110


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
