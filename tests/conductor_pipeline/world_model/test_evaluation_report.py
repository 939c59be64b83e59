"""What the world-model report says: the plain headline against the subject-aware baselines, why
family_marginal can equal global_rate (and the folds that keep it informed), and the population the
routing figure is measured on."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from sklearn.model_selection import GroupKFold

from conductor_pipeline.splits import split_of
from conductor_pipeline.world_model.cross_validation import (
    EvaluationSettings,
    family_fallback_note,
    family_spread_worker_folds,
)
from conductor_pipeline.world_model.evaluation import WorldModelReport, evaluate_world_model
from conductor_pipeline.world_model.metrics import Comparison, Estimate, SplitReport
from tests.builders import (
    FAST_WORLD_MODEL,
    SYNTHETIC_WORKERS,
    specialist_skill,
    synthetic_frame,
    synthetic_questions,
    synthetic_seats,
)

EVAL = EvaluationSettings(question_folds=3, worker_folds=3, n_bootstrap=40, model=FAST_WORLD_MODEL)


def test_the_workers_of_one_family_go_to_different_folds() -> None:
    families = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "b3": "b", "c1": "c"}
    folds = family_spread_worker_folds([*families, "loner"], families, 3)
    for family in ("a", "b"):
        members = [w for w, f in families.items() if f == family]
        assert len({folds[w] for w in members}) == len(members)
    assert set(folds.values()) == {0, 1, 2}


def test_the_note_says_when_and_why_family_marginal_is_the_global_rate() -> None:
    workers = ["a1", "a2", "b1", "c1", "none"]
    families = {"a1": "a", "a2": "a", "b1": "b", "c1": "c"}
    partial = family_fallback_note(workers, families)
    assert "for 3 of 5 held-out workers (b1, c1, none)" in partial and "differs only for a1, a2" in partial
    assert "on every row by construction" in family_fallback_note(["b1", "c1"], families)
    assert family_fallback_note(["a1", "a2"], families).startswith("Every held-out worker")


def _report(frame, seats):
    settings = EVAL.model_copy(update={"routing_pools": {"six": list(SYNTHETIC_WORKERS)}})
    return evaluate_world_model(frame, seats, settings)


@pytest.fixture(scope="module")
def specialist_frame():
    return synthetic_frame(synthetic_questions(360, seed=11), specialist_skill, seed=12)


def test_family_marginal_is_informed_when_families_have_several_workers(specialist_frame) -> None:
    held = _report(specialist_frame, synthetic_seats()).split("held_out_workers")
    # Three families of two, spread over three folds: every held-out worker's family is in training.
    assert held.note.startswith("Every held-out worker")
    assert held.scores["family_marginal"]["log_loss"].value != held.scores["global_rate"]["log_loss"].value


def test_a_family_is_spread_even_when_its_workers_have_the_fewest_rows(specialist_frame) -> None:
    # Workflow-step calls make row counts unequal; row-balancing folds (GroupKFold) then put the two
    # smallest workers in one fold, which made every family rate of that family the global rate.
    first_hundred = pl.col("question_id").str.len_chars() < 4  # q0..q99
    frame = specialist_frame.filter(~pl.col("worker").str.starts_with("alpha") | first_hundred)
    groups = frame["worker"].to_numpy()
    together = [set(groups[test]) for _, test in GroupKFold(5).split(np.zeros(len(groups)), groups=groups)]
    assert {"alpha-7b", "alpha-70b"} in together
    settings = EVAL.model_copy(update={"worker_folds": 5, "routing_pools": {}})
    held = evaluate_world_model(frame, synthetic_seats(), settings).split("held_out_workers")
    assert held.note.startswith("Every held-out worker")


def test_family_marginal_equals_global_rate_when_every_family_has_one_worker(specialist_frame) -> None:
    seats = {name: seat.model_copy(update={"family": f"own-{name}"}) for name, seat in synthetic_seats().items()}
    report = _report(specialist_frame, seats)
    held = report.split("held_out_workers")
    assert "on every row by construction" in held.note
    for metric in ("log_loss", "brier", "roc_auc"):
        assert held.scores["family_marginal"][metric].value == pytest.approx(held.scores["global_rate"][metric].value)
    assert "on every row by construction" in report.to_markdown()


def test_the_routing_figure_names_its_population(specialist_frame) -> None:
    routing = _report(specialist_frame, synthetic_seats()).routing[0]
    ids = specialist_frame["question_id"].unique().to_list()
    n_train = sum(split_of(q) == "train" for q in ids)
    assert routing.population.startswith("360 questions (math L")
    assert f"{n_train} on the train side of the project's split, {360 - n_train} on the eval side" in routing.population
    assert routing.population in routing.verdict


def _comparison(baseline: str, low: float, high: float) -> Comparison:
    return Comparison(baseline, "log_loss", Estimate((low + high) / 2, low, high))


def _with_questions_split(*comparisons: Comparison) -> WorldModelReport:
    names = ["world_model", *(c.baseline for c in comparisons)]
    scores = {name: {"log_loss": Estimate(0.5, 0.4, 0.6)} for name in names}
    split = SplitReport("questions", "", 1, 1, 1, 2, scores, list(comparisons), {})
    return WorldModelReport(splits=[split], routing=[], model_summary={}, reliability_png=b"")


def test_the_headline_says_plainly_which_baselines_w_does_not_clearly_beat() -> None:
    marginal = _comparison("worker_marginal", -0.2, -0.1)
    unclear = _with_questions_split(
        marginal, _comparison("worker_x_subject", -0.02, -0.01), _comparison("worker_x_subject_x_level", -0.01, 0.002)
    )
    assert unclear.headline.startswith(
        "W beats the per-worker marginal but does NOT clearly beat worker_x_subject_x_level"
    )
    assert not unclear.beats_subject_aware and unclear.verdicts[0] == unclear.headline
    loses = _with_questions_split(
        marginal, _comparison("worker_x_subject", 0.01, 0.02), _comparison("worker_x_subject_x_level", 0.01, 0.03)
    )
    assert "LOSES TO worker_x_subject, worker_x_subject_x_level" in loses.headline
    beats = _with_questions_split(
        marginal, _comparison("worker_x_subject", -0.02, -0.01), _comparison("worker_x_subject_x_level", -0.02, -0.01)
    )
    assert beats.beats_subject_aware and "beats the subject-aware baselines" in beats.headline
    assert np.isfinite(beats.split("questions").comparison("worker_x_subject").difference.value)
