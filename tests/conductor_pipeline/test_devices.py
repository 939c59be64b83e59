"""One device setting, resolved in one place."""

from __future__ import annotations

import pytest

from conductor_pipeline.devices import cuda_index, resolve_device


def test_a_device_setting_names_its_gpu_and_auto_follows_torch(monkeypatch):
    import torch

    assert [cuda_index(device) for device in ("cpu", "cuda", "cuda:0", "cuda:3")] == [None, None, 0, 3]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device() == "cpu" and resolve_device("cuda:1") == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("mps")
