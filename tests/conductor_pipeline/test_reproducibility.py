"""make_reproducible: the same process state, so the same draws and the same float sums, on every run."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from conductor_pipeline.reproducibility import HELD_VECTOR_KERNELS, cpu_signature, hold_vector_kernels, make_reproducible


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


INTEL = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8375C\nflags\t\t: fpu avx2 avx512f avx512bw avx512vl avx512dq\n"


def test_the_cpu_signature_names_the_model_and_the_widest_kernels_torch_uses() -> None:
    assert cpu_signature(INTEL, environ={}) == "Intel(R) Xeon(R) Platinum 8375C (avx512)"
    # AVX-512 without the subsets torch needs dispatches the AVX2 kernels.
    assert cpu_signature(INTEL.replace(" avx512bw", ""), environ={}) == "Intel(R) Xeon(R) Platinum 8375C (avx2)"
    amd = "model name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\nmodel name\t: AMD EPYC\n"
    assert cpu_signature(amd, environ={}) == "AMD EPYC (avx2)"
    assert cpu_signature("") == "unknown"
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):  # this machine, as torch reads it
        assert cpu_signature().endswith(f"({torch.backends.cpu.get_cpu_capability().lower()})")


def test_held_kernels_are_avx2_everywhere_and_leave_what_the_environment_sets() -> None:
    environ = {"OPENBLAS_CORETYPE": "Zen"}
    held = hold_vector_kernels(environ, cpuinfo=INTEL)
    assert held == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert environ["OPENBLAS_CORETYPE"] == "Zen"
    assert cpu_signature(INTEL, environ=environ) == "Intel(R) Xeon(R) Platinum 8375C (avx2)"
    no_avx2 = "model name\t: Old CPU\nflags\t\t: fpu sse4_2\n"
    assert hold_vector_kernels(environ := {}, cpuinfo=no_avx2) == {} and environ == {}


def test_the_suite_and_every_entry_point_compute_with_the_held_kernels() -> None:
    """tests/conftest.py and `assets/__init__.py` hold the kernels before torch loads: torch runs the
    AVX2 kernels on a machine with AVX-512, as `python -m assets.main` does."""
    if "avx2" in cpu_signature(environ={}) or "avx512" in cpu_signature(environ={}):
        assert torch.backends.cpu.get_cpu_capability() == "AVX2"
        script = "import assets, torch; print(torch.backends.cpu.get_cpu_capability())"
        environ = {k: v for k, v in os.environ.items() if k not in HELD_VECTOR_KERNELS}
        out = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "AVX2"
