"""Fixtures of the pool tests: a real fault server on 127.0.0.1, one per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes import FaultServer
from tests.builders import TEST_API_KEY


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
