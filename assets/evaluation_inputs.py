"""What `eval_arms` and `eval_tables` read from outside their own run: the questions training saw,
the trained policies (from the event log, never as dependencies, so a closed gate blocks no
evaluation), the train-split W that routes and fills conductor prompts, and the latest figures of
`world_model_report` and `oracle_ceilings` that the routing table sits beside.

(No `from __future__ import annotations`: Dagster checks the `context` annotation as a class.)
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from assets.deployment import RECIPE_TAG, SEED_TAG, TRAINED_RECIPE_TAG, trained_otherwise, trained_recipe
from assets.metadata import latest_metadata, latest_metadata_of, latest_metadata_value
from assets.world_model import WorldModelFitConfig, train_split_world_model_path
from conductor_pipeline.conductor.prompt import PromptSpec
from conductor_pipeline.evaluation.routers import BestSingleChoice
from conductor_pipeline.evaluation.routing_predictions import RoutingPredictions
from conductor_pipeline.evaluation.slices import DrawnSlice, training_question_ids
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_of
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.model import WorldModel, fit_train_split_world_model
from conductor_pipeline.world_model.persistence import save_world_model
from conductor_pipeline.world_model.prompts_and_pruning import prompt_predictor
from resources.warehouse import WarehouseResource

CHECKPOINT_ASSET = "conductor_checkpoint"
WARM_START_ASSET = "warm_start_policy"
CONTESTED_SET_ASSET = "contested_set"
WORLD_MODEL_REPORT_ASSET = "world_model_report"
CEILINGS_ASSET = "oracle_ceilings"


def questions_seen_in_training(store: Warehouse, instance: dg.DagsterInstance) -> list[str]:
    """Every question a conductor was trained or run on outside evaluation, with the latest
    contested set's. Read from the event log rather than as an asset dependency: evaluation must
    not wait for (or be blocked by) a training run that the gates may rightly refuse."""
    return training_question_ids(store, latest_metadata_value(instance, CONTESTED_SET_ASSET, "manifest_path"))


@dataclass(frozen=True)
class TrainedPolicy:
    """A model a training asset wrote, with the prompt and sampling it was trained under (None
    for a materialization from before the training assets recorded it)."""

    path: str
    prompt: PromptSpec | None


def run_materialization(context: dg.AssetExecutionContext, asset: str) -> Mapping[str, dg.MetadataValue] | None:
    """The metadata of `asset`'s newest materialization by a run of this run's seed and trained recipe
    (as far as this run is tagged with them; `trained_recipe`), or None. Evaluating seed 0 after
    seeds 1 and 2 trained must read seed 0's checkpoint, not the newest one; and after a seed whose
    gate closed, the newest checkpoint is another seed's, which evaluated under this seed would count
    one conductor twice."""
    tags = context.run.tags
    seed = {SEED_TAG: tags[SEED_TAG]} if SEED_TAG in tags else {}
    metadata = latest_metadata_of(context.instance, asset, seed, skip=trained_otherwise(tags))
    if metadata is not None:
        return metadata
    if (seed or RECIPE_TAG in tags) and latest_metadata(context.instance, asset) is not None:
        wanted = {**seed, TRAINED_RECIPE_TAG: trained_recipe(tags)}
        context.log.warning(f"no {asset} was materialized by a run of {wanted}; not evaluated")
    return None


def trained_policy(
    context: dg.AssetExecutionContext, asset: str, path_field: str,
    metadata: Mapping[str, dg.MetadataValue] | None = None,
) -> TrainedPolicy | None:
    """The model (its `path_field`) of `asset`'s newest materialization of this run's seed and
    trained recipe (`run_materialization`, unless its `metadata` was read already), while it is on
    disk, prompted as it was trained."""
    metadata = (run_materialization(context, asset) if metadata is None else metadata) or {}
    if path_field not in metadata:
        return None
    path = metadata[path_field].value
    if not Path(str(path)).exists():
        context.log.warning(f"{asset} model {path} is gone; not evaluated")
        return None
    prompt = metadata["prompt"].value if "prompt" in metadata else None
    if prompt is None:
        context.log.warning(f"{asset} recorded no training prompt; {path} is prompted like the conductor resource")
    return TrainedPolicy(str(path), PromptSpec.model_validate(prompt) if isinstance(prompt, Mapping) else None)


def latest_warm_start(context: dg.AssetExecutionContext) -> TrainedPolicy | None:
    """The warm-started model of this run's seed and trained recipe, when the warm start trained one
    (not the base policy it passes on when disabled) and it is still on disk."""
    metadata = run_materialization(context, WARM_START_ASSET) or {}
    warmed = metadata.get("warm_start")
    if warmed is None or warmed.value is not True:
        return None
    return trained_policy(context, WARM_START_ASSET, "model_path", metadata)


@dataclass(frozen=True)
class RoutingInputs:
    """What the train-split W gives an eval run: the model (W-router, W-cascade), the numbers
    '+W' conductor prompts show, its predictions for the slice (recorded with the run), and the
    metadata of its fit. Empty when no arm needs a W."""

    model: WorldModel | None = None
    predictor: Callable[[Question], dict[str, float]] | None = None
    predictions: RoutingPredictions | None = None
    metadata: dict[str, object] = field(default_factory=dict)


def routing_inputs(
    warehouse: WarehouseResource, pool_config: PoolConfig, seats: Sequence[WorkerSeat], drawn: DrawnSlice,
    calibration: BestSingleChoice, config: WorldModelFitConfig, log: dg.DagsterLogManager,
) -> RoutingInputs:
    """W fitted on the seats' train-split rows (saved beside the pool's all-data W), with its prompt
    numbers and slice predictions; the step fails if it saw an eval-split question or one of the slice's."""
    model = fit_train_split_world_model(warehouse.get_warehouse(), pool_config.name, seats, config.model_settings())
    w_ids = sorted(model.training_question_ids)
    on_eval_side = [qid for qid in w_ids if split_of(qid) != "train"]
    leaked = sorted(set(w_ids) & set(drawn.slice.question_ids))
    if on_eval_side or leaked:
        raise dg.Failure(f"the routing W saw eval questions: {(on_eval_side or leaked)[:5]}")
    path = save_world_model(model, train_split_world_model_path(warehouse, pool_config.name))
    log.info(f"train-split W: {len(w_ids)} questions, {model.training_summary['rows']} rows")
    return RoutingInputs(
        model, prompt_predictor(model, pool_config.workers),
        RoutingPredictions.from_model(model, seats, drawn.questions, calibration.worker),
        {
            "world_model_path": dg.MetadataValue.path(str(path)),
            "world_model_training_questions": len(w_ids),
            "world_model_training_rows": model.training_summary["rows"],
        },
    )


def world_model_routing(instance: dg.DagsterInstance, pool: str) -> Mapping[str, object] | None:
    """The latest `world_model_report`'s cross-validated routing figures for `pool`
    (`routing_figures[<pool>]`: questions, population, accuracies, headroom recovered with its
    interval), or None when the report has not routed this pool."""
    entry = (latest_metadata(instance, WORLD_MODEL_REPORT_ASSET) or {}).get(f"routing_figures[{pool}]")
    return None if entry is None else dict(entry.value)


def probe_ceilings(instance: dg.DagsterInstance, pool: str) -> dict[str, object] | None:
    """The latest `oracle_ceilings` figures (questions, best single, oracle) when they are this pool's."""
    metadata = latest_metadata(instance, CEILINGS_ASSET) or {}
    if "pool" not in metadata or metadata["pool"].value != pool:
        return None
    return {key: metadata[key].value for key in ("n_questions", "best_single", "oracle") if key in metadata}
