"""What `eval_arms` and `eval_tables` read from outside their own run: the questions training saw,
the trained policies (from the event log, never as dependencies, so a closed gate blocks no
evaluation), the train-split W that routes and fills conductor prompts, and the latest figures of
`world_model_report` and `oracle_ceilings` that the routing table sits beside.

(No `from __future__ import annotations`: Dagster checks the `context` annotation as a class.)
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from assets.deployment import SEED_TAG
from assets.metadata import latest_metadata, latest_metadata_value
from assets.world_model import WorldModelFitConfig, train_split_world_model_path
from conductor_pipeline.conductor.prompt import PromptSpec
from conductor_pipeline.evaluation.slices import training_question_ids
from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.splits import split_of
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.model import WorldModel, fit_train_split_world_model
from conductor_pipeline.world_model.persistence import save_world_model
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


def trained_policy(context: dg.AssetExecutionContext, asset: str, path_field: str) -> TrainedPolicy | None:
    """The model of `asset`'s latest materialization (its `path_field`), while it is on disk and was
    trained with this run's seed: after a seed whose gate closed, the latest checkpoint is another
    seed's, and evaluating it under this seed would count one conductor twice."""
    instance = context.instance
    path = latest_metadata_value(instance, asset, path_field)
    if path is None:
        return None
    seed = context.run.tags.get(SEED_TAG)
    event = instance.get_latest_materialization_event(dg.AssetKey(asset))
    trained_with = event and instance.get_run_by_id(event.run_id)
    trained_seed = trained_with.tags.get(SEED_TAG) if trained_with else None
    if seed is not None and trained_seed is not None and trained_seed != seed:
        context.log.warning(f"latest {asset} model {path} was trained with seed {trained_seed}, this run is seed {seed}; "
                            "not evaluated")
        return None
    if not Path(str(path)).exists():
        context.log.warning(f"latest {asset} model {path} is gone; not evaluated")
        return None
    prompt = latest_metadata_value(instance, asset, "prompt")
    if prompt is None:
        context.log.warning(f"latest {asset} recorded no training prompt; {path} is prompted like the conductor resource")
    return TrainedPolicy(str(path), PromptSpec.model_validate(prompt) if isinstance(prompt, Mapping) else None)


def latest_warm_start(context: dg.AssetExecutionContext) -> TrainedPolicy | None:
    """The latest warm-started model, when the warm start trained one (not the base policy it
    passes on when disabled) and it is still on disk."""
    if latest_metadata_value(context.instance, WARM_START_ASSET, "warm_start") is not True:
        return None
    return trained_policy(context, WARM_START_ASSET, "model_path")


def routing_world_model(
    warehouse: WarehouseResource, pool_name: str, seats: Sequence[WorkerSeat], config: WorldModelFitConfig,
    eval_ids: Sequence[str], log: dg.DagsterLogManager,
) -> tuple[WorldModel, dict[str, object]]:
    """W fitted on the seats' train-split rows (saved beside the pool's all-data W) and its metadata;
    the step fails if it saw an eval-split question or one of the slice's."""
    model = fit_train_split_world_model(warehouse.get_warehouse(), seats, config.model_settings())
    w_ids = sorted(model.training_question_ids)
    on_eval_side = [qid for qid in w_ids if split_of(qid) != "train"]
    leaked = sorted(set(w_ids) & set(eval_ids))
    if on_eval_side or leaked:
        raise dg.Failure(f"the routing W saw eval questions: {(on_eval_side or leaked)[:5]}")
    path = save_world_model(model, train_split_world_model_path(warehouse, pool_name))
    log.info(f"train-split W: {len(w_ids)} questions, {model.training_summary['rows']} rows")
    return model, {
        "world_model_path": dg.MetadataValue.path(str(path)),
        "world_model_training_questions": len(w_ids),
        "world_model_training_rows": model.training_summary["rows"],
    }


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
