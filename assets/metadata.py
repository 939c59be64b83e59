"""What every stage's metadata shares: plots the Dagster UI renders inline, as PNG data URIs, and
reading back what an asset's latest materialization published."""

import base64
from collections.abc import Callable, Iterator, Mapping

import dagster as dg


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


def latest_metadata_value(instance: dg.DagsterInstance, asset: str, field: str) -> object | None:
    """One metadata value of an asset's latest materialization, or None (never materialized here,
    or materialized without that field)."""
    entry = (latest_metadata(instance, asset) or {}).get(field)
    return None if entry is None else entry.value


def materializations(
    instance: dg.DagsterInstance, asset: str, limit: int = 1000
) -> Iterator[tuple[Mapping[str, str], dg.EventLogEntry]]:
    """(its run's tags, the event) of each of `asset`'s materializations, newest first."""
    for record in instance.fetch_materializations(dg.AssetKey(asset), limit=limit, ascending=False).records:
        run = instance.get_run_by_id(record.run_id)
        yield (run.tags if run is not None else {}), record.event_log_entry


def newest_tagged(
    instance: dg.DagsterInstance,
    asset: str,
    tags: Mapping[str, str],
    skip: Callable[[Mapping[str, str]], bool] | None = None,
    limit: int = 10_000,
) -> tuple[Mapping[str, str], dg.EventLogEntry] | None:
    """(its run's tags, the event) of `asset`'s newest materialization by a run that carries every
    one of `tags` (and that `skip` does not pass over), or None: an instance that trained several
    seeds, recipes or pools holds each one's gate, checkpoint and eval, and a reader wants its own."""
    for run_tags, event in materializations(instance, asset, limit=limit):
        if event.asset_materialization is None or (skip is not None and skip(run_tags)):
            continue
        if all(run_tags.get(key) == value for key, value in tags.items()):
            return run_tags, event
    return None


def latest_metadata_of(
    instance: dg.DagsterInstance, asset: str, tags: Mapping[str, str],
    skip: Callable[[Mapping[str, str]], bool] | None = None,
) -> Mapping[str, dg.MetadataValue] | None:
    """The metadata of `asset`'s latest materialization by a run that carries `tags` (the eval's
    pool and seed: the gate, warm start and training behind that eval, not another seed's) and that
    `skip` does not pass over (another recipe's); with neither, its latest."""
    if not tags and skip is None:
        return latest_metadata(instance, asset)
    found = newest_tagged(instance, asset, tags, skip)
    return None if found is None else found[1].asset_materialization.metadata


def stage(group: str, compute: str = "cpu") -> dict[str, object]:
    """The `@dg.asset` arguments every stage's assets share: their group, its team as owner, and the
    stage and compute tags (`@dg.asset(**stage(GROUP), kinds=...)`)."""
    return {"group_name": group, "owners": [f"team:{group}"], "tags": {"stage": group, "compute": compute}}
