"""make_reproducible: the same process state, so the same draws and the same float sums, on every run."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from conductor_pipeline.reproducibility import make_reproducible


@pytest.fixture
def restore_torch_settings() -> Iterator[None]:
    """The suite's other tests keep torch's thread count and kernel choice as they found them."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_it_fixes_the_thread_count_and_asks_for_deterministic_kernels(restore_torch_settings: None) -> None:
    make_reproducible(torch_threads=1)
    assert torch.get_num_threads() == 1
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.utils.deterministic.fill_uninitialized_memory  # a third of a CPU training step


def test_two_calls_give_the_same_unseeded_draws_and_the_same_matmul(restore_torch_settings: None) -> None:
    make_reproducible(seed=3)
    first = draws()
    weights = torch.randn(64, 64)
    product = (weights @ weights).sum().item()
    make_reproducible(seed=3)
    assert draws() == first
    assert (torch.randn(64, 64) @ torch.randn(64, 64)).sum().item() != product  # later draws differ ...
    make_reproducible(seed=3)
    draws()
    again = torch.randn(64, 64)
    assert (again @ again).sum().item() == product  # ... and the same draws give the same sum
