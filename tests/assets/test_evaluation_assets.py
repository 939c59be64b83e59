"""eval_arms + eval_tables on a 30-question slice of replay-mixed6 in a tmp warehouse, with the
tiny local HF conductor (random weights: the weak arm; shown W's predictions), the W-router arm
and its train-split-only W, and the leak check failing on a leak."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import dagster as dg
import pytest

from assets.evaluation import EVALUATION_ASSETS, EVALUATION_CHECKS, eval_slice_has_no_leak, questions_seen_in_training
from assets.metadata import latest_metadata_value
from conductor_pipeline.corpora.loaders import load_math_full
from conductor_pipeline.evaluation.arms import EvalRunSummary
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.probing.runner import run_probes
from conductor_pipeline.records import CallRecord
from conductor_pipeline.splits import split_of
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.model import WorldModel
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

SLICE = 30
CALIBRATION_QUESTIONS = 40
POOL = "replay-mixed6"


@pytest.fixture
def warehouse_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs", "math_full")
    path = tmp_path / "warehouse.duckdb"
    store = Warehouse(path)
    level5 = [q for q in load_math_full() if q.split == "test" and q.level == 5]
    store.insert("questions", level5)
    pool = load_pool(POOL)
    workers = build_workers(pool)
    covered = set.intersection(*(set(w.question_ids) for w in workers.values()))
    calibration = [q for q in level5 if q.question_id in covered and split_of(q.question_id) == "train"]
    asyncio.run(
        run_probes(
            store, pool, workers, calibration[:CALIBRATION_QUESTIONS], samples=1, temperature=0.2,
            run_id="probe-test", governor=Governor.from_pool(pool), only_recorded=True,
        )
    )
    return path


def materialize(path: Path, tiny: Path, selection: list) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        selection,
        resources={
            "warehouse": WarehouseResource(database=str(path)),
            "pool": PoolResource(pool=POOL),
            "conductor": ConductorPolicyResource(
                model_path=str(tiny), max_new_tokens=24, n_examples=1, show_predicted_success=True
            ),
        },
        run_config={
            "ops": {"eval_arms": {"config": {"slice_size": SLICE, "repeats": 1, "world_model": {"num_threads": 1}}}}
        },
    )


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    (event,) = result.asset_materializations_for_node(asset)
    return {key: value.value for key, value in event.metadata.items()}


def test_eval_arms_and_tables_on_a_30_question_slice(warehouse_path: Path, tmp_path: Path) -> None:
    tiny = build_tiny_causal_lm(tmp_path / "tiny")
    result = materialize(warehouse_path, tiny, [*EVALUATION_ASSETS, *EVALUATION_CHECKS])
    assert result.success
    (check,) = result.get_asset_check_evaluations()
    assert check.passed

    arms = metadata(result, "eval_arms")
    assert arms["planned_slice_size"] == SLICE and arms["slice_size"] == SLICE
    assert arms["calibration_questions"] == CALIBRATION_QUESTIONS
    assert len(arms["arms"]) == 6 + 3 + 1 + 1  # solo, baselines, the W-router, the conductor
    assert "w_router" in arms["arms"] and "conductor:hf:tiny+W" in arms["arms"]
    # The run id hashes the settings and the arm names in order: the same config resumes the same run.
    assert arms["run_id"] == "eval-478f76e2691392d19c8103bf"
    store = Warehouse(warehouse_path)
    counts = store.query(
        "SELECT arm, count(*) AS n, count_if(infra_failure) AS infra FROM workflows WHERE run_id = $r GROUP BY arm",
        {"r": arms["run_id"]},
    )
    assert counts.height == 11 and set(counts["n"]) == {SLICE} and set(counts["infra"]) == {0}
    questions = store.query("SELECT DISTINCT question_id FROM workflows WHERE run_id = $r", {"r": arms["run_id"]})
    assert all(split_of(q) == "eval" for q in questions["question_id"])

    tables = metadata(result, "eval_tables")
    assert tables["n_scored"] == SLICE and tables["n_label"] == f"n={SLICE} of {SLICE} planned"
    assert "conductor:hf:tiny" in tables["arm_table"] and "oracle" in tables["arm_table"]
    assert "solvable_reached_solver" in tables["decomposition"]
    assert tables["running_gap"] == "fewer than 50 common questions"
    assert tables["accuracy_vs_cost_plot"].startswith("![accuracy vs cost per arm](data:image/png;base64,")
    assert "no_workflow" in tables["parse_codes"] or "json_decode" in tables["parse_codes"]
    assert "| w_router " in tables["arm_table"]
    assert "W-router" in tables["routing_value"] and "oracle headroom recovered" in tables["routing_value"]
    assert 0.0 <= tables["w_router_accuracy"] <= 1.0
    assert "w_router" in tables["decomposition"]

    # The W that routed saw only train-split questions: the probed calibration questions, none of the slice.
    routing_w = WorldModel.load(arms["world_model_path"])
    probed = set(store.query("SELECT DISTINCT question_id FROM calls WHERE kind = 'probe'")["question_id"])
    assert routing_w.training_question_ids == probed and arms["world_model_training_questions"] == len(probed)
    assert all(split_of(q) == "train" for q in routing_w.training_question_ids)
    assert not routing_w.training_question_ids & set(questions["question_id"])
    assert check.metadata["world_model_questions_on_eval_split"].value == 0

    # The leak check fails once a training rollout is logged on an eval question.
    summary = result.output_for_node("eval_arms")
    assert isinstance(summary, EvalRunSummary)
    leaked = summary.slice_ids[0]
    store.insert(
        "calls",
        [CallRecord(call_id="train-1", run_id="grpo-run", kind="conductor", question_id=leaked, worker="conductor",
                    sample=0, subtask=None, response="model_id = []", extracted_answer=None, correct=None,
                    status="ok", error=None, prompt_tokens=1, completion_tokens=1, cost_usd=None, latency_s=0.1,
                    started_at=None)],
    )
    context = dg.build_asset_check_context(instance=dg.DagsterInstance.ephemeral())
    verdict = eval_slice_has_no_leak(
        context, eval_arms=summary, warehouse=WarehouseResource(database=str(warehouse_path))
    )
    assert verdict.passed is False and verdict.metadata["leaked_training"].value == 1

    # So does a routing W that was trained on an eval-split question.
    w_leak = dataclasses.replace(summary, extra={**summary.extra, "world_model_training_question_ids": (leaked,)})
    verdict = eval_slice_has_no_leak(context, eval_arms=w_leak, warehouse=WarehouseResource(database=str(warehouse_path)))
    assert verdict.passed is False and verdict.metadata["world_model_questions_on_eval_split"].value == 1


def test_training_questions_include_the_latest_contested_set_and_logged_rollouts(tmp_path: Path) -> None:
    store = Warehouse(tmp_path / "w.duckdb")
    instance = dg.DagsterInstance.ephemeral()
    assert questions_seen_in_training(store, instance) == []
    manifest = tmp_path / "contested.json"
    manifest.write_text('{"question_ids": ["test/algebra/1.json", "test/algebra/2.json"]}')
    instance.report_runless_asset_event(
        dg.AssetMaterialization("contested_set", metadata={"manifest_path": dg.MetadataValue.path(str(manifest))})
    )
    instance.report_runless_asset_event(
        dg.AssetMaterialization("conductor_checkpoint", metadata={"checkpoint_path": dg.MetadataValue.path("/ckpt")})
    )
    assert questions_seen_in_training(store, instance) == ["test/algebra/1.json", "test/algebra/2.json"]
    assert latest_metadata_value(instance, "conductor_checkpoint", "checkpoint_path") == "/ckpt"
