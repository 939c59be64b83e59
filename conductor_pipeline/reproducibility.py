"""One process-wide setting that makes two runs of the same graph print the same figures.

Every stage seeds its own randomness (the trainer's seed, the routers' seeds, LightGBM's seed and
`deterministic` flag); what is left is process state: the global RNGs that unseeded sampling draws
from, and torch's thread count, which decides how float sums are split across threads (a different
count can change the last bits of a logit, and sampling can follow them).

That holds on one kind of CPU. torch and MKL pick their kernels by the processor's vendor and
vector width, and the last bits follow the kernel, so runs on two kinds of CPU can part: each run
is tagged with `cpu_signature`, and the recorded figures name the CPU they came from.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

DEFAULT_SEED = 0
# Two threads: the same split of every sum on any machine with at least two cores, and no more
# threads than the 2-core machines the default run is sized for.
DEFAULT_TORCH_THREADS = 2
# Where Linux describes the processor: the model name and the instruction-set flags.
CPUINFO_PATH = Path("/proc/cpuinfo")
# The AVX-512 subsets torch needs before it dispatches its AVX-512 kernels.
AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})


def make_reproducible(seed: int = DEFAULT_SEED, torch_threads: int = DEFAULT_TORCH_THREADS) -> None:
    """Seed Python's, NumPy's and torch's global RNGs, fix torch's intra-op thread count and ask
    torch for deterministic kernels where it has them (a warning, not an error, where it has none),
    without filling uninitialized memory."""
    import torch  # imported here: the grading and warehouse layers must not pay for torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(torch_threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    # The deterministic mode also fills every new tensor's memory before use, which only matters to
    # code that reads memory it never wrote; it made the tiny conductor's SFT and GRPO steps about a
    # third slower on two cores.
    torch.utils.deterministic.fill_uninitialized_memory = False


def cpu_signature(cpuinfo: str | None = None) -> str:
    """The processor and the widest vector kernels torch and MKL pick on it, e.g.
    `AMD EPYC (avx2)`: the seeds and the thread count fix every sum's split, but not the kernels
    that compute it, so two CPUs of different vendors or vector widths can train different
    conductors from the same seed. Read from /proc/cpuinfo (`cpuinfo`: its text), not from torch,
    so that tagging a run costs no torch import; `unknown` where there is no such file."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO_PATH.read_text()
        except OSError:
            return "unknown"
    if not cpuinfo.strip():
        return "unknown"
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name") or fields.get("vendor_id") or "unknown CPU"
    flags = set(fields.get("flags", "").split())
    width = "avx512" if AVX512_FLAGS <= flags else "avx2" if "avx2" in flags else "no avx2"
    return f"{model} ({width})"
