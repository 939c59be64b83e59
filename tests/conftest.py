"""Suite-wide pytest hooks.

Each test gets its own artifacts root under its tmp dir. Long soak / kill / browser tests carry
the `slow` marker and run only with RUN_SLOW=1 (`make test-slow`), so the default CI run stays
fast on a 2-core box.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conductor_pipeline.paths import ARTIFACTS_ENV

RUN_SLOW_ENV = "RUN_SLOW"


@pytest.fixture(autouse=True)
def artifacts_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's artifacts root (files of assets, trainer output) is its own tmp folder, never the project's."""
    root = tmp_path / "artifacts"
    monkeypatch.setenv(ARTIFACTS_ENV, str(root))
    return root


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(RUN_SLOW_ENV) == "1":
        return
    skip_slow = pytest.mark.skip(reason=f"slow test: set {RUN_SLOW_ENV}=1 (or `make test-slow`) to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
