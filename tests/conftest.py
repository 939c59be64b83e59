"""Suite-wide pytest hooks.

Long soak / kill / browser tests carry the `slow` marker and run only with RUN_SLOW=1
(`make test-slow`), so the default CI run stays fast on a 2-core box.
"""

from __future__ import annotations

import os

import pytest

RUN_SLOW_ENV = "RUN_SLOW"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(RUN_SLOW_ENV) == "1":
        return
    skip_slow = pytest.mark.skip(reason=f"slow test: set {RUN_SLOW_ENV}=1 (or `make test-slow`) to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
