"""A saved world model is LightGBM model files plus JSON: it predicts exactly what the fitted model
predicts, its manifest refuses a damaged or foreign folder by name, and a pickle is never loaded."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conductor_pipeline.world_model.features import TfidfSvdText
from conductor_pipeline.world_model.model import WorldModel
from conductor_pipeline.world_model.persistence import (
    MANIFEST,
    STATE,
    WorldModelFileError,
    load_world_model,
    save_world_model,
)
from tests.builders import (
    FAST_WORLD_MODEL,
    SYNTHETIC_WORKERS,
    hostile_pickle,
    specialist_skill,
    synthetic_frame,
    synthetic_questions,
    synthetic_seats,
)


@pytest.fixture(scope="module")
def priced_model() -> WorldModel:
    """A W with a cost regressor and the TF-IDF text state (every part the folder must carry)."""
    frame = synthetic_frame(synthetic_questions(300, seed=3), specialist_skill, seed=4).with_columns(
        cost_usd=pl.col("worker").replace_strict({w: SYNTHETIC_WORKERS[w][1] * 1e-5 for w in SYNTHETIC_WORKERS},
                                                 return_dtype=pl.Float64),
        tokens_estimated=pl.lit(False),
    )
    model = WorldModel.fit(frame, synthetic_seats(), FAST_WORLD_MODEL)
    assert isinstance(model.text_model, TfidfSvdText) and model.cost_booster is not None
    return model


def test_a_saved_model_predicts_bit_for_bit_what_the_fitted_one_does(tmp_path: Path, priced_model: WorldModel) -> None:
    folder = save_world_model(priced_model, tmp_path / "w")
    loaded = load_world_model(folder)
    seats = list(synthetic_seats())
    for count in (3, 40):  # the small-batch text path and scikit-learn's
        questions = synthetic_questions(count, seed=20 + count)
        np.testing.assert_array_equal(loaded.predict_success(questions, seats), priced_model.predict_success(questions, seats))
        np.testing.assert_array_equal(loaded.predict_cost(questions, seats), priced_model.predict_cost(questions, seats))
    assert loaded.summary() == priced_model.summary()
    assert loaded.training_question_ids == priced_model.training_question_ids
    assert loaded.feature_importance() == priced_model.feature_importance()
    assert sorted(p.name for p in folder.iterdir()) == ["cost.lgb", MANIFEST, STATE, "success.lgb"]


def test_saving_again_replaces_the_folder_whole(tmp_path: Path, priced_model: WorldModel) -> None:
    folder = save_world_model(priced_model, tmp_path / "w")
    (folder / "stray.txt").write_text("left by nobody")
    save_world_model(priced_model, folder)
    assert not (folder / "stray.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["w"]  # no staging or previous folder left behind


def test_a_file_that_does_not_match_the_manifest_is_refused_by_name(tmp_path: Path, priced_model: WorldModel) -> None:
    folder = save_world_model(priced_model, tmp_path / "w")
    booster = folder / "success.lgb"
    booster.write_text(booster.read_text().replace("leaf_value=", "leaf_value=9", 1))
    with pytest.raises(WorldModelFileError, match=str(booster)) as refused:
        load_world_model(folder)
    assert "make run" in str(refused.value)


def test_a_truncated_file_and_a_missing_manifest_are_refused(tmp_path: Path, priced_model: WorldModel) -> None:
    folder = save_world_model(priced_model, tmp_path / "w")
    state = folder / STATE
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(WorldModelFileError, match="truncated"):
        load_world_model(folder)
    (folder / MANIFEST).unlink()
    with pytest.raises(WorldModelFileError, match="never completed"):
        load_world_model(folder)


def test_another_format_version_or_feature_list_is_refused(tmp_path: Path, priced_model: WorldModel) -> None:
    folder = save_world_model(priced_model, tmp_path / "w")
    manifest_path = folder / MANIFEST
    original = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**original, "world_model_format": 99}))
    with pytest.raises(WorldModelFileError, match="format 99"):
        load_world_model(folder)
    manifest_path.write_text(json.dumps({**original, "features": original["features"][1:]}))
    with pytest.raises(WorldModelFileError, match="features differ"):
        load_world_model(folder)


def test_a_malicious_pickle_at_the_old_path_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    old = tmp_path / "world_model" / "replay-mixed6.pkl"
    old.parent.mkdir()
    old.write_bytes(hostile_pickle(marker))
    pickle.loads(old.read_bytes())  # the payload is live: unpickling it does run code
    assert marker.exists()
    marker.unlink()
    with pytest.raises(WorldModelFileError, match="pickled world model") as refused:
        load_world_model(old)
    assert "never loaded" in str(refused.value) and "make run" in str(refused.value)
    assert not marker.exists()
