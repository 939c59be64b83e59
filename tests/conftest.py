"""Suite-wide pytest hooks.

Each test gets its own artifacts root under its tmp dir. Long soak / kill / browser tests carry
the `slow` marker and run only with RUN_SLOW=1 (`make test-slow`), so the default CI run stays
fast on a 2-core box.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from conductor_pipeline.reproducibility import hold_vector_kernels

# The kernels every entry point computes with (assets/__init__.py), set before a test imports torch.
hold_vector_kernels()

from conductor_pipeline.paths import ARTIFACTS_ENV  # noqa: E402
from tests.shared_data import require_shared_data

if TYPE_CHECKING:
    from conductor_pipeline.pools.backends.transformers_serve import TransformersServer

RUN_SLOW_ENV = "RUN_SLOW"

# Under pytest-xdist each worker is one process per core: one OpenMP thread each for torch's intra-op
# pool instead of a pool per core in every worker, which oversubscribes the cores. Set before torch
# loads, and inherited by the subprocesses tests start. LightGBM is not held by it: the W's settings
# pass `num_threads` (2) explicitly, which overrides this (docs/LOG.md, 2026-12-07 seventh).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def artifacts_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's artifacts root (files of assets, trainer output) is its own tmp folder, never the project's."""
    root = tmp_path / "artifacts"
    monkeypatch.setenv(ARTIFACTS_ENV, str(root))
    return root


@pytest.fixture(scope="session")
def served_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TransformersServer]:
    """`transformers serve` on 127.0.0.1 serving the tiny offline model (random weights), for the
    tests of clients against a real server: one server a session (a worker's)."""
    from conductor_pipeline.pools.backends.transformers_serve import TransformersServer  # noqa: PLC0415
    from conductor_pipeline.training.tiny_models import build_tiny_causal_lm  # noqa: PLC0415

    root = tmp_path_factory.mktemp("tiny-serve")
    with TransformersServer(build_tiny_causal_lm(root / "model"), log_path=root / "serve.log") as server:
        yield server


@pytest.fixture
def default_run_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared data a whole default run reads: the corpora and the recorded answers."""
    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train",
                        "zeroeval_outputs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(RUN_SLOW_ENV) == "1":
        return
    skip_slow = pytest.mark.skip(reason=f"slow test: set {RUN_SLOW_ENV}=1 (or `make test-slow`) to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
