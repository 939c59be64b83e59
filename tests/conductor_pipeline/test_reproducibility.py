"""make_reproducible: the same process state, so the same draws and the same float sums, on every run."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from conductor_pipeline.reproducibility import cpu_signature, make_reproducible


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


def test_the_cpu_signature_names_the_model_and_the_widest_kernels_torch_uses() -> None:
    intel = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8375C\nflags\t\t: fpu avx2 avx512f avx512bw avx512vl avx512dq\n"
    assert cpu_signature(intel) == "Intel(R) Xeon(R) Platinum 8375C (avx512)"
    # AVX-512 without the subsets torch needs dispatches the AVX2 kernels.
    assert cpu_signature(intel.replace(" avx512bw", "")) == "Intel(R) Xeon(R) Platinum 8375C (avx2)"
    amd = "model name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\nmodel name\t: AMD EPYC\n"
    assert cpu_signature(amd) == "AMD EPYC (avx2)"
    assert cpu_signature("") == "unknown"
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):  # this machine, as torch reads it
        assert cpu_signature().endswith(f"({torch.backends.cpu.get_cpu_capability().lower()})")
