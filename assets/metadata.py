"""What every stage's metadata shares: plots the Dagster UI renders inline, as PNG data URIs, and
reading back what an asset's latest materialization published."""

import base64
import io
from collections.abc import Mapping

import dagster as dg

# 80 dpi left 7-pt tick labels unreadable in the UI; 110 keeps them sharp at a modest size.
PLOT_DPI = 110


def figure_png(figure, *, tight_bbox: bool = False) -> bytes:
    """Render a matplotlib figure to PNG bytes and close it (figures left open leak memory)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=PLOT_DPI, bbox_inches="tight" if tight_bbox else None)
    plt.close(figure)
    return buffer.getvalue()


def png_markdown_text(png: bytes, alt: str) -> str:
    """Markdown for an inline image: the UI renders data URIs (a path value would show only text)."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def png_markdown(png: bytes, alt: str) -> dg.MetadataValue:
    return dg.MetadataValue.md(png_markdown_text(png, alt))


def latest_metadata(instance: dg.DagsterInstance, asset: str) -> Mapping[str, dg.MetadataValue] | None:
    """The metadata of an asset's latest materialization, or None (never materialized here)."""
    event = instance.get_latest_materialization_event(dg.AssetKey(asset))
    if event is None or event.asset_materialization is None:
        return None
    return event.asset_materialization.metadata
