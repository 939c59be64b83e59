"""World-model assets: W trained on every scored call in the warehouse, and its report vs baselines.

    pass_rates -> world_model -> world_model_report [check: beats the worker marginal (warn)]

`world_model` fits W on all scored probe and workflow-step calls (every pool's) with the current
pool's catalogue, and saves it next to the warehouse. `world_model_report` evaluates W out of
sample (questions grouped, workers held out) against the marginal baselines, routes the current
pool on held-out questions, and shows the verdict lines, the metrics table and the reliability
diagram in the UI. The check warns, not blocks: W is optional, its hooks are used only where it
earns them.
"""

from pathlib import Path

import dagster as dg
import polars as pl

from assets.metadata import png_markdown, stage
from assets.probing import pass_rates
from conductor_pipeline.files import write_bytes_atomic, write_text_atomic
from conductor_pipeline.world_model.cross_validation import EvaluationSettings
from conductor_pipeline.world_model.data import load_training_frame, rows_by_source
from conductor_pipeline.world_model.evaluation import WorldModelReport, evaluate_world_model
from conductor_pipeline.world_model.features import WorldModelSettings
from conductor_pipeline.world_model.model import WorldModel
from conductor_pipeline.world_model.persistence import WorldModelFileError, load_world_model, save_world_model
from resources.knobs import library_field
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource

GROUP = "world_model"
BEATS_MARGINAL_CHECK = "beats_worker_marginal"
BEATS_MARGINAL_DESCRIPTION = (
    "Does W's out-of-fold log loss beat the per-worker marginal accuracy (one number per worker, the weakest "
    "baseline) with a bootstrap interval over questions clear of 0? Passing says W knows more than which worker "
    "is stronger; it says nothing about the subject-aware baselines, which the verdict reports separately."
)
# Where the pool's train-split W is saved, next to its all-data W (`world_model_path`).
TRAIN_SPLIT_W_SUFFIX = "-train-split"


class WorldModelFitConfig(dg.Config):
    """Knobs of one W fit: fields of the library's WorldModelSettings, same names, help and defaults."""

    text_representation: str = library_field(WorldModelSettings, "text_representation")
    text_components: int = library_field(WorldModelSettings, "text_components")
    num_threads: int = library_field(WorldModelSettings, "num_threads")

    def model_settings(self) -> WorldModelSettings:
        return WorldModelSettings(**{name: getattr(self, name) for name in WorldModelFitConfig.model_fields})


class WorldModelConfig(WorldModelFitConfig):
    """Knobs of the fit and of the evaluation (EvaluationSettings fields, same names, help and defaults)."""

    question_folds: int = library_field(EvaluationSettings, "question_folds")
    worker_folds: int = library_field(EvaluationSettings, "worker_folds")
    n_bootstrap: int = library_field(EvaluationSettings, "n_bootstrap")
    lambda_cost: float = library_field(EvaluationSettings, "lambda_cost")

    def evaluation_settings(self, routing_pools: dict[str, list[str]]) -> EvaluationSettings:
        return EvaluationSettings(
            question_folds=self.question_folds,
            worker_folds=self.worker_folds,
            n_bootstrap=self.n_bootstrap,
            lambda_cost=self.lambda_cost,
            model=self.model_settings(),
            routing_pools=routing_pools,
        )


def world_model_path(warehouse: WarehouseResource, pool_name: str) -> Path:
    """Where the pool's world model is saved (a folder: LightGBM model files, JSON state, a manifest);
    the training assets read it from here for pruning."""
    return warehouse.artifact_dir("world_model") / pool_name


def train_split_world_model_path(warehouse: WarehouseResource, pool_name: str) -> Path:
    """Where eval_arms saves the pool's train-split W (fitted on train-split questions only)."""
    return warehouse.artifact_dir("world_model") / f"{pool_name}{TRAIN_SPLIT_W_SUFFIX}"


@dg.asset(
    **stage(GROUP), deps=[pass_rates], kinds={"lightgbm", "duckdb"},
)
def world_model(
    context: dg.AssetExecutionContext, config: WorldModelConfig, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """W(subtask, worker) -> P(success) (+ cost/latency where the telemetry has them), fitted on every
    scored call of the pool's seats that this pool's runs wrote."""
    pool_config = pool.load()
    frame = load_training_frame(warehouse.get_warehouse(), pool_config.worker_names, pool=pool_config.name)
    if frame.is_empty():
        raise dg.Failure("no scored probe or step calls in the warehouse: materialize probe_calls first")
    seats = {seat.name: seat for seat in pool_config.workers}
    model = WorldModel.fit(frame, seats, config.model_settings())
    path = save_world_model(model, world_model_path(warehouse, pool_config.name))
    summary = model.summary()
    context.log.info(f"world model fitted on {frame.height} rows, saved to {path}")
    return dg.MaterializeResult(
        metadata={
            "rows": dg.MetadataValue.int(frame.height),
            "rows_by_source": dg.MetadataValue.json(summary["rows_by_source"]),
            "questions": dg.MetadataValue.int(summary["questions"]),
            "workers": dg.MetadataValue.int(summary["workers"]),
            "cost_model": dg.MetadataValue.text(summary["cost"]),
            "latency_model": dg.MetadataValue.text(summary["latency"]),
            "top_features": dg.MetadataValue.json(dict(list(model.feature_importance().items())[:10])),
            "summary": dg.MetadataValue.json(summary),
            "model_path": dg.MetadataValue.path(str(path)),
        }
    )


@dg.asset(
    **stage(GROUP),
    deps=[world_model],
    kinds={"lightgbm"},
    check_specs=[
        dg.AssetCheckSpec(BEATS_MARGINAL_CHECK, asset="world_model_report", description=BEATS_MARGINAL_DESCRIPTION)
    ],
)
def world_model_report(
    context: dg.AssetExecutionContext, config: WorldModelConfig, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """W vs per-worker marginal baselines out of sample, and the W-router on the pool's held-out questions."""
    pool_config = pool.load()
    frame = load_training_frame(warehouse.get_warehouse(), pool_config.worker_names, pool=pool_config.name)
    seats = {seat.name: seat for seat in pool_config.workers}
    try:
        full_model = load_world_model(world_model_path(warehouse, pool_config.name))
    except WorldModelFileError as exc:
        raise dg.Failure(str(exc)) from exc
    settings = config.evaluation_settings({pool_config.name: pool_config.solo_worker_names})
    report = evaluate_world_model(frame, seats, settings, full_model=full_model)
    out_dir = warehouse.artifact_dir("world_model")
    png_path = out_dir / f"{pool_config.name}-reliability.png"
    write_bytes_atomic(png_path, report.reliability_png, "reliability diagram")
    report_path = out_dir / f"{pool_config.name}-report.md"
    write_text_atomic(report_path, report.to_markdown(image_path=png_path.name), "world-model report")
    for line in report.verdicts:
        context.log.info(line)
    return dg.MaterializeResult(
        metadata=world_model_report_metadata(report, frame, report_path), check_results=[beats_marginal_result(report)]
    )


def world_model_report_metadata(
    report: WorldModelReport, frame: pl.DataFrame, report_path: Path
) -> dict[str, dg.MetadataValue]:
    """The verdicts, the metrics table and reliability diagram, and per routed pool the headroom W recovers."""
    metadata = {
        "verdict": dg.MetadataValue.md("\n".join(f"- {line}" for line in report.verdicts)),
        "metrics": dg.MetadataValue.md(report.to_markdown()),
        "reliability_diagram": png_markdown(report.reliability_png, "reliability diagram"),
        "beats_worker_marginal": dg.MetadataValue.bool(report.split("questions").beats("worker_marginal", "log_loss")),
        "beats_subject_aware": dg.MetadataValue.bool(report.beats_subject_aware),
        "rows_by_source": dg.MetadataValue.json(rows_by_source(frame)),
        "report_path": dg.MetadataValue.path(str(report_path)),
    }
    for routing in report.routing:
        metadata[f"headroom_recovered[{routing.pool}]"] = dg.MetadataValue.float(routing.headroom_recovered.value)
        metadata[f"routing_population[{routing.pool}]"] = dg.MetadataValue.text(routing.population)
        metadata[f"routing_figures[{routing.pool}]"] = dg.MetadataValue.json(routing.figures())
    return metadata


def beats_marginal_result(report: WorldModelReport) -> dg.AssetCheckResult:
    """W earns its place only by beating the per-worker marginal on unseen questions (log loss); warns, never blocks."""
    questions = report.split("questions")
    return dg.AssetCheckResult(
        check_name=BEATS_MARGINAL_CHECK,
        passed=questions.beats("worker_marginal", "log_loss"),
        severity=dg.AssetCheckSeverity.WARN,
        description=report.headline,
        metadata={
            "verdict": dg.MetadataValue.text(questions.verdict),
            "beats_subject_aware": dg.MetadataValue.bool(report.beats_subject_aware),
        },
    )


WORLD_MODEL_ASSETS = [world_model, world_model_report]
