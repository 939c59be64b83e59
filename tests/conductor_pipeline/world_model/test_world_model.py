"""The world model on synthetic frames whose truth is known: where worker x subject matters W must
beat the worker marginal; where only the worker matters it must not (beyond noise)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_of
from conductor_pipeline.world_model.cross_validation import EvaluationSettings
from conductor_pipeline.world_model.evaluation import evaluate_world_model
from conductor_pipeline.world_model.features import TfidfSvdText, build_features
from conductor_pipeline.world_model.model import WorldModel
from conductor_pipeline.world_model.persistence import load_world_model, save_world_model
from conductor_pipeline.world_model.prompts_and_pruning import (
    audit_pruning,
    out_of_fold_prompt_success,
    predicted_success_for_prompt,
    prune_zero_variance,
)
from tests.builders import (
    FAST_WORLD_MODEL,
    SYNTHETIC_WORKERS,
    specialist_skill,
    synthetic_frame,
    synthetic_questions,
    synthetic_seats,
)

EVAL = EvaluationSettings(question_folds=3, worker_folds=3, n_bootstrap=60, model=FAST_WORLD_MODEL)










def _worker_only_skill(worker: str, subject: str) -> float:
    return SYNTHETIC_WORKERS[worker][2]


@pytest.fixture(scope="module")
def specialist_frame() -> pl.DataFrame:
    return synthetic_frame(synthetic_questions(480, seed=1), specialist_skill, seed=2)


@pytest.fixture(scope="module")
def fitted(specialist_frame: pl.DataFrame) -> WorldModel:
    return WorldModel.fit(specialist_frame, synthetic_seats(), FAST_WORLD_MODEL)


def test_w_beats_the_worker_marginal_where_worker_x_subject_matters(specialist_frame: pl.DataFrame) -> None:
    report = evaluate_world_model(specialist_frame, synthetic_seats(), EVAL)
    split = report.split("questions")
    assert split.beats("worker_marginal", "log_loss")
    assert split.beats("worker_marginal", "roc_auc")
    assert "BEATS worker_marginal" in split.verdict
    # The W-router is scored beside best single and oracle on held-out questions.
    routing = report.routing[0]
    assert {"w_router", "best_single", "oracle"} <= set(routing.accuracy)
    assert routing.accuracy["w_router"].value > routing.accuracy["best_single"].value
    assert routing.accuracy["oracle"].value >= routing.accuracy["w_router"].value
    assert routing.headroom_recovered.value > 0
    # The held-out-worker split ran, with W blind to worker identity, and a PNG diagram was drawn.
    held = report.split("held_out_workers")
    assert set(held.scores) == {"world_model", "global_rate", "family_marginal", "question_rate_other_workers"}
    assert report.reliability_png.startswith(b"\x89PNG")
    markdown = report.to_markdown()
    assert "held_out_workers" in markdown and "headroom" in markdown


def test_w_does_not_beat_the_marginal_when_only_the_worker_matters() -> None:
    frame = synthetic_frame(synthetic_questions(480, seed=3), _worker_only_skill, seed=4)
    report = evaluate_world_model(frame, synthetic_seats(), EVAL.model_copy(update={"held_out_workers": False}))
    comparison = next(
        c for c in report.split("questions").comparisons if c.baseline == "worker_marginal" and c.metric == "log_loss"
    )
    assert not comparison.w_better, report.split("questions").verdict
    assert "BEATS worker_marginal" not in report.split("questions").verdict


def test_features_are_identical_for_training_and_scoring(specialist_frame: pl.DataFrame, fitted: WorldModel) -> None:
    rows = specialist_frame.head(12)
    training_matrix, names = build_features(rows, fitted.seats, text_model=fitted.text_model, vocabulary=fitted.vocabulary)
    assert training_matrix.shape == (12, len(names))
    question = Question(
        rows["question_id"][0], "math", "test", rows["problem"][0], "1", subject=rows["subject"][0], level=rows["level"][0]
    )
    ordered_workers = rows.filter(pl.col("question_id") == question.question_id)["worker"].to_list()
    batched = fitted.predict_success([question], ordered_workers)[0]
    row_by_row = fitted.predict_frame(rows.filter(pl.col("question_id") == question.question_id))
    np.testing.assert_allclose(batched, row_by_row, rtol=1e-6)
    # The small-batch TF-IDF path equals scikit-learn's transform.
    text_model = fitted.text_model
    assert isinstance(text_model, TfidfSvdText)
    texts = specialist_frame["subtask"].unique().sort().to_list()[:20]
    np.testing.assert_allclose(
        np.vstack([text_model.transform([t]) for t in texts]), text_model.transform(texts), atol=1e-5
    )


def test_subject_features_only_for_whole_question_calls(fitted: WorldModel) -> None:
    whole = pl.DataFrame(
        {"worker": ["alpha-7b"], "subtask": ["find the area"], "problem": ["find the area"], "subject": ["Geometry"], "level": [3]}
    )
    piece = whole.with_columns(problem=pl.lit("find the area, then the radius"))
    names = fitted.feature_names
    whole_row = fitted.features_for(whole)[0]
    piece_row = fitted.features_for(piece)[0]
    kept = [names[i] for i in fitted.kept_columns]
    assert not math.isnan(whole_row[kept.index("subject")])
    assert math.isnan(piece_row[kept.index("subject")]) and math.isnan(piece_row[kept.index("level")])


def test_unseen_worker_is_predicted_from_its_catalogue() -> None:
    frame = synthetic_frame(synthetic_questions(240, seed=5), lambda w, s: math.log(SYNTHETIC_WORKERS[w][1]) - 2.5, seed=6)
    model = WorldModel.fit(frame, synthetic_seats(), FAST_WORLD_MODEL.model_copy(update={"exclude_features": ("worker",)}))
    big = WorkerSeat(name="delta-400b", backend="replay", replay_source="zeroeval", model="delta-400b",
                     description="unseen", family="delta", params_b=400.0)
    small = big.model_copy(update={"name": "delta-1b", "model": "delta-1b", "params_b": 1.0})
    question = synthetic_questions(1, seed=7)[0]
    predicted = model.predict_success([question], [big, small])[0]
    assert predicted[0] > predicted[1] + 0.2
    assert "delta-400b" not in model.seats  # scoring a new seat does not change the model


def test_prompt_hook_gives_each_worker_a_probability(fitted: WorldModel) -> None:
    seats = synthetic_seats()
    geometry = Question("new", "math", "test", "In triangle ABC the angle at A is 30; find the area of the circle.", "1", subject="Geometry", level=3)
    shown = predicted_success_for_prompt(fitted, geometry, seats)
    assert list(shown) == list(seats)
    assert all(0.0 <= p <= 1.0 for p in shown.values())
    # The alpha family is the geometry specialist in this frame.
    assert shown["alpha-70b"] > shown["beta-8b"]


def test_training_prompts_get_numbers_from_a_w_that_never_saw_their_question(specialist_frame: pl.DataFrame) -> None:
    seats = synthetic_seats()
    questions = [q for q in synthetic_questions(480, seed=1) if split_of(q.question_id) == "train"][:40]
    shown = out_of_fold_prompt_success(specialist_frame, questions, seats, folds=3, settings=FAST_WORLD_MODEL)
    assert set(shown) == {q.question_id for q in questions}
    assert all(list(numbers) == list(seats) and all(0 <= p <= 1 for p in numbers.values()) for numbers in shown.values())
    # Rewrite one question's outcomes (every worker right): its own numbers do not move, since the
    # W that gives them was fitted without its rows; W's numbers for questions of other folds do.
    target = questions[0].question_id
    rewritten = specialist_frame.with_columns(
        pl.when(pl.col("question_id") == target).then(True).otherwise(pl.col("correct")).alias("correct")
    )
    again = out_of_fold_prompt_success(rewritten, questions, seats, folds=3, settings=FAST_WORLD_MODEL)
    assert again[target] == shown[target]
    assert any(again[q] != shown[q] for q in shown if q != target)


def test_pruning_skips_questions_w_predicts_everyone_or_no_one_solves() -> None:
    def skill(worker: str, subject: str) -> float:
        return {"Geometry": 6.0, "Number Theory": -6.0}.get(subject, SYNTHETIC_WORKERS[worker][2] * 2)

    frame = synthetic_frame(synthetic_questions(400, seed=8), skill, seed=9)
    model = WorldModel.fit(frame, synthetic_seats(), FAST_WORLD_MODEL)
    fresh = synthetic_questions(40, seed=10)
    kept, skipped = prune_zero_variance(model, fresh, synthetic_seats(), low=0.1, high=0.9)
    assert len(kept) + len(skipped) == len(fresh)
    skipped_subjects = {q.subject for q in skipped}
    assert skipped_subjects <= {"Geometry", "Number Theory"} and skipped
    assert {q.subject for q in kept} >= {"Algebra", "Counting & Probability"}
    observed = {q.question_id: [1.0, 1.0, 1.0] for q in skipped}
    observed[skipped[0].question_id] = [1.0, 0.0, 1.0]  # one skip was wrong: its group had variance
    audit = audit_pruning(skipped, observed)
    assert (audit.skipped, audit.observed, audit.really_zero_variance) == (len(skipped), len(skipped), len(skipped) - 1)
    assert "really had zero reward variance" in audit.describe()
    assert prune_zero_variance(model, [], synthetic_seats()) == ([], [])
    with pytest.raises(ValueError):
        prune_zero_variance(model, fresh, synthetic_seats(), low=0.9, high=0.1)


def test_save_load_roundtrip(tmp_path, fitted: WorldModel) -> None:
    questions = synthetic_questions(5, seed=11)
    before = fitted.predict_success(questions, list(synthetic_seats()))
    path = save_world_model(fitted, tmp_path / "w" / "model")
    loaded = load_world_model(path)
    np.testing.assert_array_equal(loaded.predict_success(questions, list(synthetic_seats())), before)
    assert loaded.summary() == fitted.summary()


def test_summary_says_what_was_not_trained(fitted: WorldModel) -> None:
    summary = fitted.summary()
    assert summary["cost"].startswith("not trained")
    assert "replay" in summary["latency"]
    assert np.isnan(fitted.predict_cost(["x"], ["alpha-7b"])).all()


def test_cost_regressor_trains_where_costs_exist(specialist_frame: pl.DataFrame) -> None:
    priced = specialist_frame.with_columns(
        cost_usd=pl.col("worker").replace_strict({w: SYNTHETIC_WORKERS[w][1] * 1e-5 for w in SYNTHETIC_WORKERS}, return_dtype=pl.Float64),
        tokens_estimated=pl.lit(False),
    )
    model = WorldModel.fit(priced, synthetic_seats(), FAST_WORLD_MODEL)
    assert model.cost_info.trained
    cost = model.predict_cost(["any subtask"], ["gamma-3b", "beta-72b"])[0]
    assert cost[1] > cost[0]


def test_bootstrap_metrics_equal_scikit_learn_under_weights() -> None:
    from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

    from conductor_pipeline.world_model.metrics import _WeightedMetrics, expected_calibration_error

    rng = np.random.default_rng(0)
    y = (rng.random(500) < 0.6).astype(float)
    p = np.clip(np.round(0.6 + 0.3 * (y - 0.5) + rng.normal(0, 0.2, 500), 1), 0.1, 0.9)  # many ties
    weights = rng.integers(0, 3, 500).astype(float)
    ours = _WeightedMetrics(y, p)(weights)
    expected = [
        log_loss(y, p, sample_weight=weights),
        brier_score_loss(y, p, sample_weight=weights),
        roc_auc_score(y, p, sample_weight=weights),
        expected_calibration_error(y, p, weights),
    ]
    np.testing.assert_allclose(ours, expected, rtol=1e-9)
