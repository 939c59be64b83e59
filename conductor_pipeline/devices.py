"""Where local models run: one device setting (`auto`, `cpu`, `cuda`, `cuda:N`) and its resolution.

The conductor's local policy, the trainer (warm start, GRPO, the frozen recursive policy) and the
resources that configure them all read a device setting through these functions, so `auto` means
the same everywhere.
"""

from __future__ import annotations

import re

AUTO_DEVICE = "auto"
# What a device setting may say: `auto` (a GPU when torch sees one, else the CPU), `cpu`, `cuda`
# (the current GPU) or `cuda:N`.
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
DEVICE_HELP = (
    "Where local models run: 'auto' (cuda when torch sees a GPU, else cpu), 'cpu', 'cuda' or 'cuda:N'"
)


def resolve_device(device: str = AUTO_DEVICE) -> str:
    """The torch device a setting names: `auto` becomes `cuda` when torch sees a GPU and `cpu`
    otherwise; `cpu`, `cuda` and `cuda:N` are kept as written (a configuration may be built on a
    machine other than the one that runs it)."""
    if not DEVICE_PATTERN.fullmatch(device):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device != AUTO_DEVICE:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cuda_index(device: str) -> int | None:
    """The GPU index a resolved device names (`cuda:N` -> N); None for `cpu` and plain `cuda`."""
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else None


def select_cuda_device(device: str) -> None:
    """Make `cuda:N` the current GPU, so code that places tensors on plain `cuda` (a trainer under
    accelerate, one process) uses it; nothing for `cpu` or `cuda`."""
    index = cuda_index(device)
    if index is not None:
        import torch

        torch.cuda.set_device(index)
