"""The fault server itself: each fault looks on the wire the way a real provider's does."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from tests.fakes import FaultKind, FaultRates, FaultServer

BODY = {"model": "m", "messages": [{"role": "user", "content": "what is six times seven"}], "max_tokens": 64}


@pytest.fixture(scope="module")
def srv() -> Iterator[FaultServer]:
    with FaultServer(retry_after_s=1.5, hang_s=5.0) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh(srv: FaultServer) -> None:
    srv.reset()


def post(srv: FaultServer, timeout: float = 5.0) -> httpx.Response:
    return httpx.post(f"{srv.base_url}/chat/completions", json=BODY, timeout=timeout)


def test_ok_is_an_openai_shaped_completion(srv: FaultServer) -> None:
    payload = post(srv).json()
    choice = payload["choices"][0]
    assert choice["message"]["content"] == "The answer is \\boxed{42}."
    assert choice["finish_reason"] == "stop"
    assert payload["usage"]["prompt_tokens"] == 5
    assert payload["usage"]["total_tokens"] == payload["usage"]["prompt_tokens"] + payload["usage"]["completion_tokens"]


def test_rate_limit_carries_retry_after_in_seconds_and_ms(srv: FaultServer) -> None:
    srv.queue(FaultKind.RATE_LIMIT)
    response = post(srv)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"  # whole seconds, rounded up
    assert response.headers["retry-after-ms"] == "1500"


@pytest.mark.parametrize(("kind", "status"), [("server_error", 500), ("bad_request", 400)])
def test_error_statuses(srv: FaultServer, kind: str, status: int) -> None:
    srv.queue(kind)
    assert post(srv).status_code == status


def test_reasoning_only_and_truncated_bodies(srv: FaultServer) -> None:
    srv.queue("reasoning_only", "truncated")
    reasoning = post(srv).json()
    assert reasoning["choices"][0]["message"]["content"] is None
    assert reasoning["choices"][0]["message"]["reasoning_content"]
    assert reasoning["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    truncated = post(srv).json()
    assert truncated["choices"][0]["finish_reason"] == "length"


def test_malformed_body_is_not_json(srv: FaultServer) -> None:
    srv.queue("malformed")
    response = post(srv)
    assert response.status_code == 200
    with pytest.raises(ValueError):
        response.json()


def test_reset_drops_the_connection(srv: FaultServer) -> None:
    srv.queue("reset")
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        post(srv)


def test_hang_outlasts_the_client_and_is_released_when_it_leaves(srv: FaultServer) -> None:
    srv.queue("hang")
    with pytest.raises(httpx.ReadTimeout):
        post(srv, timeout=0.3)
    # The server notices the hang-up; a fresh request is served normally meanwhile.
    assert post(srv).status_code == 200
    deadline = time.monotonic() + 3.0
    while srv.stats().in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = srv.stats()
    assert stats.in_flight == 0
    assert stats.served["hang"] == 1 and stats.served["ok"] == 1


def test_counters_queue_and_health(srv: FaultServer) -> None:
    srv.queue("server_error", "truncated")
    for _ in range(4):
        post(srv)
    stats = srv.stats()
    assert stats.total_requests == 4
    assert stats.served["server_error"] == 1 and stats.served["truncated"] == 1 and stats.served["ok"] == 2
    assert [entry["max_tokens"] for entry in stats.log] == [64] * 4
    assert httpx.get(f"{srv.root_url}/health").status_code == 200
    assert srv.stats().total_requests == 4  # admin and health routes are not counted
    srv.reset()
    assert srv.stats().total_requests == 0


def test_random_faults_follow_the_configured_rates(srv: FaultServer) -> None:
    srv.configure(faults=FaultRates(server_error=0.5))
    try:
        with httpx.Client(timeout=5.0) as client:
            codes = [client.post(f"{srv.base_url}/chat/completions", json=BODY).status_code for _ in range(200)]
    finally:
        srv.configure(faults=FaultRates())
    assert 60 <= codes.count(500) <= 140  # seeded draw: about half
    assert srv.stats().served["server_error"] == codes.count(500)


def test_expected_key_is_enforced() -> None:
    with FaultServer(expected_api_key="sk-abc") as server:
        assert post(server).status_code == 401
        ok = httpx.post(f"{server.base_url}/chat/completions", json=BODY, headers={"Authorization": "Bearer sk-abc"})
        assert ok.status_code == 200
        stats = server.stats()
    assert stats.unauthorized == 1 and stats.auth_ok == 1 and stats.total_requests == 1


def test_rates_cannot_exceed_one() -> None:
    with pytest.raises(ValidationError):
        FaultRates(rate_limit=0.6, hang=0.5)
    spread = FaultRates.spread(0.2, ["reset", "hang"])
    assert spread.reset == pytest.approx(0.1) and spread.total == pytest.approx(0.2)


def test_the_product_never_imports_the_test_doubles() -> None:
    """The fakes are test support: no module of the library, the resources or the assets imports
    anything under tests/ (benchmarks and tests may)."""
    root = Path(__file__).resolve().parents[2]
    product = [path for package in ("conductor_pipeline", "resources", "assets") for path in (root / package).rglob("*.py")]
    assert len(product) > 50
    importing = [str(path.relative_to(root)) for path in product
                 if re.search(r"^\s*(from|import)\s+tests\b", path.read_text(), flags=re.MULTILINE)]
    assert not importing, f"product modules import tests/: {importing}"
