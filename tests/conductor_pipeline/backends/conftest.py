"""Shared helpers for backend tests: seats pointed at a real fault server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conductor_pipeline.fakes import FaultServer
from conductor_pipeline.pools import WorkerSeat
from conductor_pipeline.records import CallRequest, ChatMessage, Question

TEST_API_KEY = "sk-test-9f8e7d6c5b4a-DO-NOT-LEAK"
KEY_ENV = "FAULT_SERVER_TEST_KEY"


def make_seat(endpoint: str, **overrides: object) -> WorkerSeat:
    fields: dict = dict(
        name="w0", backend="openai", model="fault-model", description="a seat on the fault server",
        endpoint=endpoint, price_input_per_mtok=2.5, price_output_per_mtok=10.0, max_tokens=1024, timeout_s=2.0,
    )
    fields.update(overrides)
    return WorkerSeat(**fields)


def make_request(index: int = 0, *, sample: int = 0, max_tokens: int | None = None) -> CallRequest:
    question = Question(question_id=f"q{index}", corpus="math", split="test", problem="What is 6*7?", answer="42")
    return CallRequest(
        question=question, messages=(ChatMessage("user", f"Question {index}: what is 6 times 7?"),),
        sample=sample, max_tokens=max_tokens,
    )


@pytest.fixture(scope="module")
def fault_server() -> Iterator[FaultServer]:
    """One server per test module (start-up costs a Python process); counters reset per test."""
    with FaultServer(latency_s=0.0, retry_after_s=0.2, hang_s=10.0, expected_api_key=TEST_API_KEY) as srv:
        yield srv


@pytest.fixture
def server(fault_server: FaultServer) -> FaultServer:
    fault_server.reset()
    fault_server.configure(retry_after_s=0.2, latency_s=0.0)
    return fault_server
