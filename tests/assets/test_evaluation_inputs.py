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


def test_checkpoint_arms_are_sampled_at_the_configured_temperature_and_prompted_as_trained(tmp_path: Path) -> None:
    from assets.evaluation import conductor_resources
    from assets.evaluation_config import EvalArmsConfig
    from conductor_pipeline.conductor.prompt import PromptSpec, write_trained_prompt
    from resources.conductor import ConductorPolicyResource

    trained_prompt = PromptSpec(naming="names", n_examples=0, max_new_tokens=192, temperature=1.0,
                                constrained_decoding=True, fan_outs_only=True)
    folders = [tmp_path / "configured", tmp_path / "trained"]
    for folder in folders:
        folder.mkdir()
        write_trained_prompt(folder, trained_prompt)
    trained = [TrainedPolicy(path=str(folders[1]), prompt=trained_prompt)]
    conductor = ConductorPolicyResource(device="cpu")

    def arms(**config) -> list[ConductorPolicyResource]:
        return conductor_resources(EvalArmsConfig(conductor_checkpoints=[str(folders[0])], **config), conductor, trained)

    assert [arm.prompt_spec for arm in arms()] == [trained_prompt, trained_prompt]
    greedy = arms(checkpoint_temperature=0.0)
    assert [arm.prompt_spec for arm in greedy] == [trained_prompt.model_copy(update={"temperature": 0.0})] * 2
    assert [arm.arm_label for arm in greedy] == [arm.arm_label for arm in arms()]  # same arm, another run id
