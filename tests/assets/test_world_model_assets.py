"""world_model and world_model_report on a synthetic warehouse whose truth is known."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import polars as pl
import yaml

from assets.evaluation_config import EvalArmsConfig
from assets.world_model import (
    BEATS_MARGINAL_CHECK,
    BEATS_MARGINAL_DESCRIPTION,
    WORLD_MODEL_ASSETS,
    WorldModelConfig,
    WorldModelFitConfig,
    world_model_report,
)
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.cross_validation import EvaluationSettings
from conductor_pipeline.world_model.features import WorldModelSettings
from conductor_pipeline.world_model.persistence import load_world_model
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource
from tests.builders import hostile_pickle, specialist_skill, synthetic_frame, synthetic_questions, synthetic_seats

FAST_CONFIG = {"num_threads": 1, "text_components": 8, "question_folds": 3, "worker_folds": 3, "n_bootstrap": 40}


def _fill(tmp_path: Path) -> tuple[Path, Path]:
    questions = synthetic_questions(360, seed=21)
    frame = synthetic_frame(questions, specialist_skill, seed=22)
    path = tmp_path / "warehouse.duckdb"
    store = Warehouse(path)
    store.insert("questions", questions)
    calls = frame.select(
        call_id=pl.col("question_id") + "|" + pl.col("worker"),
        run_id=pl.lit("r1"),
        kind=pl.lit("probe"),
        question_id="question_id",
        worker="worker",
        sample=pl.lit(0, dtype=pl.Int32),
        subtask=pl.lit(None, dtype=pl.String),  # a probe of the whole question carries no subtask text
        correct="correct",
        status=pl.lit("ok"),
        pool=pl.lit("synthetic"),
    )
    unscored = calls.head(20).with_columns(call_id=pl.col("call_id") + "|t", correct=pl.lit(None, dtype=pl.Boolean), status=pl.lit("transient"))
    store.insert("calls", pl.concat([calls, unscored]))
    pool_file = tmp_path / "synthetic.yaml"
    seats = [seat.model_dump(exclude_none=True, exclude={"vllm"}) for seat in synthetic_seats().values()]
    pool_file.write_text(yaml.safe_dump({"name": "synthetic", "workers": seats}))
    return path, pool_file


def test_world_model_and_report_materialize_with_verdict(tmp_path: Path) -> None:
    warehouse_path, pool_file = _fill(tmp_path)
    result = dg.materialize(
        WORLD_MODEL_ASSETS,
        resources={"warehouse": WarehouseResource(database=str(warehouse_path)), "pool": PoolResource(pool=str(pool_file))},
        run_config={"ops": {name: {"config": FAST_CONFIG} for name in ("world_model", "world_model_report")}},
    )
    assert result.success
    fitted = {k: v.value for k, v in result.asset_materializations_for_node("world_model")[0].metadata.items()}
    assert fitted["rows"] == 360 * 6  # the 20 transient calls are not training rows
    assert fitted["cost_model"].startswith("not trained")
    model = load_world_model(fitted["model_path"])
    assert model.predict_success(synthetic_questions(2, seed=23), list(synthetic_seats())).shape == (2, 6)

    report = {k: v.value for k, v in result.asset_materializations_for_node("world_model_report")[0].metadata.items()}
    assert "BEATS worker_marginal" in report["verdict"]
    assert report["beats_worker_marginal"] is True
    assert "data:image/png;base64," in report["reliability_diagram"]
    assert "headroom_recovered[synthetic]" in report
    figures = report["routing_figures[synthetic]"]  # what eval_tables' routing summary reads
    assert figures["headroom_recovered"][0] == report["headroom_recovered[synthetic]"]
    assert figures["best_single"] <= figures["oracle"] and figures["questions"] > 0
    check = result.get_asset_check_evaluations()[0]
    assert check.check_name == BEATS_MARGINAL_CHECK and check.passed
    # The check says what it tests, and its result says plainly where W stands against every baseline.
    spec = next(iter(world_model_report.check_specs))
    assert spec.description == BEATS_MARGINAL_DESCRIPTION and "subject-aware" in spec.description
    assert check.description.startswith("W beats the per-worker marginal")
    assert report["verdict"].startswith(f"- {check.description}")
    assert isinstance(report["beats_subject_aware"], bool)
    assert report["routing_population[synthetic]"].startswith("360 questions (math L")



def test_pickles_planted_at_the_old_paths_are_never_executed_and_an_old_one_is_refused(tmp_path: Path) -> None:
    """The old layout saved W as `world_model/<pool>.pkl` (and `-train-split.pkl`): hostile pickles
    planted there run no code while W is fitted and reported; with no new-format W beside it, the
    report refuses the pickle and says how to rebuild."""
    warehouse_path, pool_file = _fill(tmp_path)
    warehouse = WarehouseResource(database=str(warehouse_path))
    marker = tmp_path / "pwned"
    old_paths = [warehouse.artifact_dir("world_model") / f"synthetic{suffix}.pkl" for suffix in ("", "-train-split")]
    for old in old_paths:
        old.write_bytes(hostile_pickle(marker))
    resources = {"warehouse": warehouse, "pool": PoolResource(pool=str(pool_file))}
    run_config = {"ops": {name: {"config": FAST_CONFIG} for name in ("world_model", "world_model_report")}}
    assert dg.materialize(WORLD_MODEL_ASSETS, resources=resources, run_config=run_config).success
    assert not marker.exists()

    shutil.rmtree(warehouse.artifact_dir("world_model") / "synthetic")  # only the earlier version's pickle is left
    result = dg.materialize(
        [world_model_report], resources=resources, run_config={"ops": {"world_model_report": {"config": FAST_CONFIG}}},
        raise_on_error=False,
    )
    assert not result.success and not marker.exists()
    failure = next(event for event in result.all_events if event.is_step_failure).step_failure_data.error.message
    assert str(old_paths[0]) in failure and "never loaded" in failure and "make run" in failure

def test_the_config_exposes_library_knobs_under_their_names_help_defaults_and_bounds() -> None:
    for config in (WorldModelConfig, WorldModelFitConfig):
        for name, field in config.model_fields.items():
            library = WorldModelSettings if name in WorldModelSettings.model_fields else EvaluationSettings
            declared = library.model_fields[name]
            assert field.description and field.description == declared.description, name
            assert (field.default, field.metadata) == (declared.default, declared.metadata), name
    assert set(WorldModelConfig.model_fields) == {
        "text_representation", "text_components", "num_threads", "question_folds", "worker_folds", "n_bootstrap",
        "lambda_cost",
    }
    # The eval run's train-split W takes the same fit knobs, nested under `world_model`.
    assert EvalArmsConfig.model_fields["world_model"].annotation is WorldModelFitConfig
    assert WorldModelConfig().model_settings() == WorldModelSettings()
    assert WorldModelConfig().evaluation_settings({}) == EvaluationSettings()
