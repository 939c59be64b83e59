"""The process-wide settings that make two runs of the same graph print the same figures.

Every stage seeds its own randomness (the trainer's seed, the routers' seeds, LightGBM's seed and
`deterministic` flag); what is left is process state: the global RNGs that unseeded sampling draws
from, torch's thread count, which decides how float sums are split across threads (a different
count can change the last bits of a logit, and sampling can follow them), and the vector kernels
the float libraries pick for the processor.

torch, MKL, oneDNN and OpenBLAS pick their kernels by the processor's vector width, and the last
bits follow the kernel. `hold_vector_kernels` holds all four to AVX2 (before any of them loads), so
a machine with AVX-512 computes what one without it does: on an AMD EPYC with AVX-512, held, the
default run reproduced every figure of a run on an AMD EPYC without it (docs/reliability.md). The
vendor still matters (an Intel Xeon held the same way trained another conductor), so each run is tagged with
`cpu_signature` and the recorded figures name the CPU they came from; a verdict is pooled over seeds.
"""

from __future__ import annotations

import os
import random
from collections.abc import MutableMapping
from pathlib import Path

DEFAULT_SEED = 0
# Two threads: the same split of every sum on any machine with at least two cores, and no more
# threads than the 2-core machines the default run is sized for.
DEFAULT_TORCH_THREADS = 2
# Where Linux describes the processor: the model name and the instruction-set flags.
CPUINFO_PATH = Path("/proc/cpuinfo")
# The AVX-512 subsets torch needs before it dispatches its AVX-512 kernels.
AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
# The widest kernels each float library may use, as its own variable names them: AVX2 for torch's
# ATen, MKL's conditional numerical reproducibility, oneDNN and OpenBLAS (Haswell: its AVX2 kernels).
# Read when each library loads, so they are set before numpy or torch is imported. A variable the
# environment already sets is left as it is (some machines set OPENBLAS_CORETYPE for their own reasons).
HELD_VECTOR_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell",
}


def make_reproducible(seed: int = DEFAULT_SEED, torch_threads: int = DEFAULT_TORCH_THREADS) -> None:
    """Seed Python's, NumPy's and torch's global RNGs, fix torch's intra-op thread count and ask
    torch for deterministic kernels where it has them (a warning, not an error, where it has none),
    without filling uninitialized memory."""
    import numpy as np  # imported here: `hold_vector_kernels` must run before numpy loads OpenBLAS
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


def _cpu_fields(cpuinfo: str | None) -> dict[str, str] | None:
    """The first processor's fields of /proc/cpuinfo (`cpuinfo`: its text); None where there is none."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO_PATH.read_text()
        except OSError:
            return None
    if not cpuinfo.strip():
        return None
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _native_width(fields: dict[str, str]) -> str:
    flags = set(fields.get("flags", "").split())
    return "avx512" if AVX512_FLAGS <= flags else "avx2" if "avx2" in flags else "no avx2"


def hold_vector_kernels(environ: MutableMapping[str, str] = os.environ, cpuinfo: str | None = None) -> dict[str, str]:
    """Hold torch, MKL, oneDNN and OpenBLAS to AVX2 kernels on a processor that has AVX2 (what it
    set). Call it before numpy or torch is imported: `assets/__init__.py` does, for every entry point."""
    fields = _cpu_fields(cpuinfo)
    if fields is None or _native_width(fields) == "no avx2":
        return {}
    held = {name: value for name, value in HELD_VECTOR_KERNELS.items() if name not in environ}
    environ.update(held)
    return held


def cpu_signature(cpuinfo: str | None = None, environ: MutableMapping[str, str] = os.environ) -> str:
    """The processor and the widest vector kernels torch and MKL use on it, e.g. `AMD EPYC (avx2)`:
    the seeds and the thread count fix every sum's split, but not the kernels that compute it, so
    two CPUs of different vendors or vector widths can train different conductors from the same
    seed. A width held by `hold_vector_kernels` counts as that width. Read from /proc/cpuinfo
    (`cpuinfo`: its text), not from torch, so that tagging a run costs no torch import; `unknown`
    where there is no such file."""
    fields = _cpu_fields(cpuinfo)
    if fields is None:
        return "unknown"
    model = fields.get("model name") or fields.get("vendor_id") or "unknown CPU"
    width = _native_width(fields)
    if width == "avx512" and environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2":
        width = "avx2"
    return f"{model} ({width})"
