"""How the training assets reach the library: the recipe, the training set, the device and the
rollout executors from their resources, each failure of these as a failed step with the library's
message; and the run ids that make an interrupted step's rerun the same run.

(No `from __future__ import annotations`: Dagster checks the `context` annotation as a class.)
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from assets.world_model import world_model_path
from conductor_pipeline.conductor.hf_policy import policy_fingerprint
from conductor_pipeline.conductor.prompt import PromptSpec, write_trained_prompt
from conductor_pipeline.records import Question
from conductor_pipeline.training.dataset import (
    TrainingDataError,
    TrainingSet,
    bonus_predictor,
    build_training_set,
)
from conductor_pipeline.training.recipe import Recipe
from conductor_pipeline.training.rollouts import PoolExecutor, frozen_conductor
from conductor_pipeline.training.stages import PROBE_PHASE, ExecutorFor, GRPORun
from conductor_pipeline.training.telemetry import RolloutLog, forget_run, rollout_run_id
from resources.pool import PoolResource
from resources.trainer import TrainerResource
from resources.warehouse import WarehouseResource


@contextmanager
def failing_step() -> Iterator[None]:
    """Training data that cannot be assembled fails the step with the library's message."""
    try:
        yield
    except TrainingDataError as exc:
        raise dg.Failure(str(exc)) from exc


def contested_dir(warehouse: WarehouseResource) -> Path:
    """Where the contested set's files live: next to the warehouse."""
    return warehouse.artifact_dir("contested_set")


def recipe_of(trainer: TrainerResource) -> Recipe:
    """The trainer's recipe; one whose settings contradict each other fails the step, saying which."""
    try:
        return trainer.recipe()
    except ValueError as exc:
        raise dg.Failure(str(exc)) from exc


def training_set(warehouse: WarehouseResource, pool: PoolResource, recipe: Recipe) -> TrainingSet:
    pool_config = pool.load()
    prompt, data = recipe.prompt, recipe.data
    with failing_step():
        return build_training_set(
            warehouse.get_warehouse(), pool_config, contested_dir(warehouse),
            naming=prompt.naming, n_examples=prompt.n_examples, contested_subpools=data.contested_subpools,
            prune_with=world_model_path(warehouse, pool_config.name) if data.prune_with_world_model else None,
            prune_low=data.prune_low, prune_high=data.prune_high, show_predicted_success=prompt.show_predicted_success,
            ranked_catalogue=prompt.ranked_catalogue,
        )


def prompt_metadata(prompt: PromptSpec, model_folder: Path) -> dict[str, dg.MetadataValue]:
    """The training prompt as metadata, also written beside the weights (`write_trained_prompt`), so
    a checkpoint evaluated by path on any pool is prompted as it was trained."""
    write_trained_prompt(model_folder, prompt)
    return {"prompt": dg.MetadataValue.json(prompt.model_dump())}


def training_device(trainer: TrainerResource) -> str:
    """The device this step trains and samples the policy on (`TrainerResource.training_device`)."""
    try:
        return trainer.training_device()
    except ValueError as exc:
        raise dg.Failure(str(exc)) from exc


def rollout_executor(
    training: TrainingSet, recipe: Recipe, pool: PoolResource, questions: Sequence[Question], **kwargs: object
) -> PoolExecutor:
    """Rollouts on the pool's workers (conductor seats are answered by the executor's conductor
    policy, not a Worker), sampled like GRPO's and recursing at most `recipe.max_depth` levels."""
    pool_config = training.pool_config
    workers = pool.build_workers([seat.name for seat in pool_config.workers if not seat.is_conductor])
    return PoolExecutor(
        pool_config, workers, questions, training.naming, max_depth=recipe.max_depth,
        temperature=recipe.prompt.temperature, max_new_tokens=recipe.prompt.max_new_tokens, **kwargs,
    )


def grpo_run(trainer: TrainerResource, recipe: Recipe, training: TrainingSet, phase: str) -> GRPORun:
    """The probe's (`PROBE_PHASE`) or the training's (`TRAINING_PHASE`) GRPO run on this pool: its
    settings, start policy and device, and an id that says what it computes (`TrainerResource.run_key`)."""
    pool_name = training.pool_config.name
    settings = recipe.probe() if phase == PROBE_PHASE else recipe.grpo
    start_policy = trainer.start_policy_path(pool_name)
    run_id = f"{phase}-{pool_name}-{trainer.run_key(recipe, settings, training, start_policy)}"
    folder = trainer.probe_dir(pool_name) if phase == PROBE_PHASE else trainer.checkpoint_dir(pool_name)
    return GRPORun(phase, run_id, folder / run_id, start_policy, settings, training_device(trainer))


def grpo_executor_for(
    training: TrainingSet, recipe: Recipe, warehouse: WarehouseResource, pool: PoolResource, run: GRPORun,
    questions: Sequence[Question],
) -> ExecutorFor:
    """GRPO's rollouts of `run`, recorded under the log they are given, with W's predictions when the
    reward bonus is on; a frozen copy of the start policy answers conductor steps when the pool seats
    the conductor. Built when the stage runs (a probe read back builds none)."""
    pool_config = training.pool_config

    def executor_for(log: RolloutLog) -> PoolExecutor:
        with failing_step():
            predict = bonus_predictor(
                recipe.grpo.world_model_bonus_weight, world_model_path(warehouse, pool_config.name), pool_config.workers
            )
        return rollout_executor(
            training, recipe, pool, questions, predict_success=predict, log=log,
            conductor_policy=frozen_conductor(pool_config, run.start_policy, run.device),
        )

    return executor_for


def observe_progress(context: dg.AssetExecutionContext) -> Callable[[dict], None]:
    """Each progress report of a running GRPO run as an observation of the asset, so the UI plots
    step, rollouts per second and the reward trend while the run goes (a GPU run lasts hours)."""

    def observe(figures: dict) -> None:
        numbers = {key: float(value) for key, value in figures.items() if isinstance(value, (int, float))}
        context.log_event(dg.AssetObservation(asset_key=context.asset_key, metadata=numbers))

    return observe


def repeatable_run_id(
    context: dg.AssetExecutionContext, kind: str, pool: str, policy: Path | str, training: TrainingSet
) -> str:
    """The id the warm start's parse-check rollouts are logged under: what decides them (the asset's
    code version, the policy's weights, the questions), so a rerun after an interruption is the same
    run and starts by deleting what the interrupted attempt left (`forget_run`)."""
    code_version = context.assets_def.code_versions_by_key.get(context.asset_key)
    run_id = rollout_run_id(kind, pool, code_version, policy_fingerprint(policy), [q.question_id for q in training.questions])
    forget_run(training.store, run_id)
    return run_id


