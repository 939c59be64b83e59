"""What eval_arms reads from the event log: the trained policy of its own seed and recipe."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation as a class.
from pathlib import Path

import dagster as dg

from assets.evaluation_inputs import CHECKPOINT_ASSET, TrainedPolicy, trained_policy


def checkpoint_asset(folder: Path) -> dg.AssetsDefinition:
    @dg.asset(name=CHECKPOINT_ASSET)
    def conductor_checkpoint() -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"checkpoint_path": dg.MetadataValue.path(str(folder))})

    return conductor_checkpoint


def test_an_eval_reads_the_checkpoint_of_its_own_seed_and_recipe_not_the_newest(tmp_path: Path) -> None:
    """Seeds 0 and 1 trained in turn: evaluating seed 0 afterwards reads seed 0's checkpoint; a seed
    or a recipe that trained nothing gets no trained arm rather than another's conductor."""
    instance = dg.DagsterInstance.ephemeral()
    for seed in ("0", "1"):
        folder = tmp_path / f"seed-{seed}"
        folder.mkdir()
        dg.materialize([checkpoint_asset(folder)], instance=instance, tags={"seed": seed, "recipe": "cpu"})
    seen: dict[tuple[str, str], TrainedPolicy | None] = {}

    @dg.asset
    def reader(context: dg.AssetExecutionContext) -> None:
        tags = context.run.tags
        seen[(tags["seed"], tags["recipe"])] = trained_policy(context, CHECKPOINT_ASSET, "checkpoint_path")

    for seed, recipe in (("0", "cpu"), ("1", "cpu"), ("2", "cpu"), ("0", "cpu+zoo")):
        dg.materialize([reader], instance=instance, tags={"seed": seed, "recipe": recipe})
    assert seen[("0", "cpu")].path == str(tmp_path / "seed-0")
    assert seen[("1", "cpu")].path == str(tmp_path / "seed-1")
    assert seen[("2", "cpu")] is None and seen[("0", "cpu+zoo")] is None
