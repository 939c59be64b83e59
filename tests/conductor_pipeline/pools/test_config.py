"""Pool seats: the backend a pool file names, and what each backend means for the seat."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conductor_pipeline.pools.config import Backend, PoolConfigError, WorkerSeat, load_pool

SEATS = {
    "openai": WorkerSeat(name="h", backend="openai", model="m", description="d", endpoint="http://127.0.0.1:9/v1"),
    "vllm": WorkerSeat(name="v", backend="vllm", model="m", description="d"),
    "replay": WorkerSeat(name="r", backend="replay", replay_source="zeroeval", model="m", description="d"),
    "conductor": WorkerSeat(name="self", backend="conductor", model="c", description="the conductor itself"),
    "vote": WorkerSeat(name="vote", backend="vote", model="majority-vote", description="majority of what it sees"),
}


def test_the_backend_of_a_pool_file_is_a_backend_value_and_dumps_back_into_a_pool_file(tmp_path: Path) -> None:
    assert set(SEATS) == {backend.value for backend in Backend}
    for text, seat in SEATS.items():
        assert seat.backend == Backend(text) and seat.backend == text
    path = tmp_path / "dumped.yaml"
    dumped = [seat.model_dump(exclude_none=True) for seat in SEATS.values()]
    path.write_text(yaml.safe_dump({"name": "dumped", "workers": dumped}))
    assert load_pool(path).workers == list(SEATS.values())


@pytest.mark.parametrize(
    ("backend", "is_conductor", "is_replay", "is_vllm", "needs_endpoint"),
    [
        ("openai", False, False, False, True),
        ("vllm", False, False, True, False),
        ("replay", False, True, False, False),
        ("conductor", True, False, False, False),
        ("vote", False, False, False, False),
    ],
)
def test_what_each_backend_means_for_its_seat(
    backend: str, is_conductor: bool, is_replay: bool, is_vllm: bool, needs_endpoint: bool
) -> None:
    seat = SEATS[backend]
    assert (seat.is_conductor, seat.is_replay, seat.is_vllm, seat.needs_endpoint) == (
        is_conductor, is_replay, is_vllm, needs_endpoint,
    )


def test_a_shipped_pool_reads_its_seats_backends() -> None:
    pool = load_pool("local-qwen-vllm")
    assert pool.workers and all(seat.is_vllm and not seat.needs_endpoint for seat in pool.workers)
    assert all(seat.is_replay for seat in load_pool("replay-mixed6").workers)


def test_only_seats_that_answer_alone_are_solo_workers() -> None:
    assert {name for name, seat in SEATS.items() if seat.answers_alone} == {"openai", "vllm", "replay"}
    assert SEATS["vote"].is_vote and not any(seat.is_vote for name, seat in SEATS.items() if name != "vote")
    pool = load_pool("replay-mixed6-vote")
    assert pool.solo_worker_names == load_pool("replay-mixed6").worker_names
    assert pool.worker_names == [*pool.solo_worker_names, "majority-vote"]
    assert pool.seat("majority-vote").cost_usd(10_000, 10_000) == 0.0


@pytest.mark.parametrize(
    "field", [{"endpoint": "http://127.0.0.1:9/v1"}, {"replay_source": "zeroeval"}, {"price_output_per_mtok": 1.0}]
)
def test_a_vote_seat_refuses_fields_that_configure_a_model_call(tmp_path: Path, field: dict) -> None:
    path = tmp_path / "pool.yaml"
    seat = {"name": "v", "backend": "vote", "model": "majority-vote", "description": "d", **field}
    path.write_text(yaml.safe_dump({"name": "p", "workers": [seat]}))
    with pytest.raises(PoolConfigError, match=f"worker 'v'.*vote seat calls no model.*{next(iter(field))}"):
        load_pool(path)
