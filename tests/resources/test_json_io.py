"""The IO manager between assets writes JSON and reads back exactly what was handed on; it refuses
to pickle anything, and refuses a file of another type or a damaged one by name."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from conductor_pipeline.evaluation.arms import EvalRunSummary
from conductor_pipeline.evaluation.routing_predictions import RoutingPredictions
from resources.json_io import JsonIOManager


def summary() -> EvalRunSummary:
    predictions = RoutingPredictions(
        question_ids=("q1", "q2"), workers=("a", "b"), success=np.array([[0.1, 1 / 3], [0.7, 0.25]]),
        cost=np.array([[math.nan, 1e-7], [2e-5, math.nan]]), prices=(1.5, 0.25), fallback="a",
    )
    return EvalRunSummary(
        run_id="eval-1", corpus="math", slice_ids=("q1", "q2"), planned_size=400, split_fingerprint="fp",
        repeats=1, arms=("solo:a", "w_router"), best_single_worker="a", calibration_question_ids=("t1",),
        extra={"pool": "p", "math_levels": (5,), "replayed": True, "w_router_lambda_cost": 0.0,
               "routing_predictions": predictions},
    )


def test_an_output_round_trips_through_json_bit_for_bit(tmp_path: Path) -> None:
    handed = summary()

    @dg.asset
    def producer() -> EvalRunSummary:
        return handed

    @dg.asset
    def consumer(producer: EvalRunSummary) -> None:
        assert producer.run_id == handed.run_id and producer.arms == handed.arms
        assert dict(producer.extra, routing_predictions=None) == dict(handed.extra, routing_predictions=None)
        got, want = producer.extra["routing_predictions"], handed.extra["routing_predictions"]
        np.testing.assert_array_equal(got.success, want.success)
        np.testing.assert_array_equal(got.cost, want.cost)  # NaN where there was NaN
        assert got.fingerprint() == want.fingerprint()

    io = JsonIOManager(base_dir=str(tmp_path / "outputs"))
    assert dg.materialize([producer, consumer], resources={"io_manager": io}).success
    stored = tmp_path / "outputs" / "producer.json"
    assert stored.read_text().startswith('{\n "type": "conductor_pipeline.evaluation.arms.EvalRunSummary"')
    assert not any(p.suffix in ("", ".pkl") for p in (tmp_path / "outputs").rglob("*") if p.is_file())


def test_a_value_without_a_json_form_is_refused_not_pickled(tmp_path: Path) -> None:
    @dg.asset
    def opaque() -> dict:
        return {"a": 1}

    result = dg.materialize([opaque], resources={"io_manager": JsonIOManager(base_dir=str(tmp_path))}, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
    assert "never pickled" in failure.to_string()
    assert list(tmp_path.iterdir()) == []


def test_a_stored_file_of_another_type_or_damaged_is_refused_by_name(tmp_path: Path) -> None:
    @dg.asset
    def producer() -> EvalRunSummary:
        return summary()

    @dg.asset
    def consumer(producer: EvalRunSummary) -> None:
        pass

    io = JsonIOManager(base_dir=str(tmp_path))
    assert dg.materialize([producer], resources={"io_manager": io}).success
    stored = tmp_path / "producer.json"
    stored.write_bytes(pickle.dumps(summary()))  # what a hostile writer could leave: never unpickled
    result = dg.materialize([producer, consumer], selection=[consumer], resources={"io_manager": io}, raise_on_error=False)
    assert not result.success
    message = str(next(e for e in result.all_events if e.is_step_failure).step_failure_data.error.to_string())
    assert str(stored) in message and "damaged" in message


@pytest.mark.parametrize("tuple_field", ["slice_ids", "arms", "calibration_question_ids"])
def test_tuples_come_back_as_tuples(tuple_field: str) -> None:
    restored = EvalRunSummary.from_json_dict(summary().to_json_dict())
    assert isinstance(getattr(restored, tuple_field), tuple)
    assert restored.extra["math_levels"] == (5,)
