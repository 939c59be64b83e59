"""The test models are held out: recognised whoever serves them, refused in a training pool, and
the shipped pools of test models hold nothing else."""

from __future__ import annotations

import pytest

from conductor_pipeline.paths import POOLS_DIR
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat, load_pool
from conductor_pipeline.pools.test_models import TEST_MODELS, TestModelError, is_test_model, refuse_test_models


def seat(name: str, model: str) -> WorkerSeat:
    return WorkerSeat(name=name, backend="replay", model=model, description=f"{name} model", replay_source="zeroeval")


def test_a_test_model_is_one_whoever_serves_it_and_however_it_is_cased():
    assert len(TEST_MODELS) == 12
    assert is_test_model(seat("a", "Meta-Llama-3.1-70B-Instruct@hyperbolic"))
    assert is_test_model(seat("b", "gemma-2-27B-it"))
    assert not is_test_model(seat("c", "Meta-Llama-3.1-8B-Instruct"))
    assert not is_test_model(seat("d", "gpt-4o-2024-08-06"))


def test_a_training_pool_with_a_test_model_is_refused_naming_the_pool_and_the_seat():
    pool = PoolConfig(name="mixed", workers=[seat("big", "gpt-4o-2024-08-06"), seat("mini", "gpt-4o-mini-2024-07-18")])
    with pytest.raises(TestModelError, match=r"pool 'mixed' \(f.yaml\) seats test models \['mini'\]"):
        refuse_test_models(pool, "f.yaml")
    refuse_test_models(load_pool("replay-mixed6"))  # the default pool trains on none of them


@pytest.mark.parametrize("path", sorted(POOLS_DIR.glob("replay-test-*.yaml")), ids=lambda p: p.stem)
def test_the_shipped_pools_of_test_models_seat_only_test_models(path):
    pool = load_pool(path)
    models = [w for w in pool.workers if not w.is_vote]
    assert len(models) >= 4 and all(is_test_model(w) for w in models)


def test_the_shipped_pools_of_test_models_come_in_sizes_orders_and_with_a_vote():
    pools = {p.stem: load_pool(p) for p in POOLS_DIR.glob("replay-test-*.yaml")}
    six, reordered = pools["replay-test-six"], pools["replay-test-six-reordered"]
    assert sorted(six.worker_names) == sorted(reordered.worker_names) and six.worker_names != reordered.worker_names
    assert len({len(p.workers) for p in pools.values()}) >= 3
    assert any(p.vote_seat_names for p in pools.values())


def test_the_zoo_and_the_validation_models_are_disjoint_and_hold_no_test_model():
    """A conductor for any pool trains on the zoo and is developed against the validation six: it must
    never have met them, nor a test model."""
    zoo, validation = load_pool("replay-zoo-train"), load_pool("replay-validation-six")
    refuse_test_models(zoo)
    refuse_test_models(validation)
    zoo_models = {seat.model.casefold() for seat in zoo.workers}
    assert not zoo_models & {seat.model.casefold() for seat in validation.workers}
    assert len(zoo.workers) >= 8 and len(validation.workers) == 6
    tested = {seat.model.casefold() for p in POOLS_DIR.glob("replay-test-*.yaml") for seat in load_pool(p).workers}
    assert not zoo_models & tested
