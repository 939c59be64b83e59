"""The test models: twelve recorded models held out of everything a conductor's training sees.

A conductor trained on randomised pools should route over workers it never saw; that is only
measured honestly on models no learned part of its training met (not in a training pool, not in
the rows its prompts' world model was fitted on). A seat is a test model when its `model` is one of
these, whoever serves it: `Meta-Llama-3.1-70B-Instruct@hyperbolic` is one too. Develop on other
models; evaluate on pools of these (data/pools/replay-test-*.yaml) for the final figures only.
"""

from __future__ import annotations

from collections.abc import Iterable

from conductor_pipeline.pools.config import PoolConfig, WorkerSeat

TEST_MODELS: frozenset[str] = frozenset({
    "Mistral-Large-2", "Qwen2-72B-Instruct", "gemma-2-9b-it", "Phi-3-mini-4k-instruct",
    "Meta-Llama-3.1-70B-Instruct", "claude-3-haiku-20240307", "gpt-4o-mini-2024-07-18", "Qwen2.5-32B-Instruct",
    "gemini-1.5-flash", "Yi-1.5-34B-Chat", "gemma-2-27b-it", "Meta-Llama-3-70B-Instruct",
})
_TEST_MODELS_FOLDED = frozenset(model.casefold() for model in TEST_MODELS)


class TestModelError(ValueError):
    """A test model where training would see it."""

    __test__ = False  # not a pytest class


def is_test_model(seat: WorkerSeat) -> bool:
    """Whether the seat serves a test model (its `model`, less any `@provider` suffix, case ignored)."""
    return seat.model.split("@", 1)[0].strip().casefold() in _TEST_MODELS_FOLDED


def test_model_seats(seats: Iterable[WorkerSeat]) -> list[str]:
    """The names of the seats that serve a test model."""
    return [seat.name for seat in seats if is_test_model(seat)]


def refuse_test_models(pool: PoolConfig, source: str = "") -> None:
    """Refuse a training pool that seats a test model, naming the pool, its file and the seats."""
    held_out = test_model_seats(pool.workers)
    if held_out:
        where = f" ({source})" if source else ""
        raise TestModelError(
            f"pool {pool.name!r}{where} seats test models {held_out}: they are held out of training "
            f"(conductor_pipeline.pools.test_models); train on a pool of other models"
        )
