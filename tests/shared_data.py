"""Where tests find the project's real data: `$CORYPHAEUS_DATA_DIR`, else ../shared/data.

Tests that read real corpora call `require_shared_data`, which fails (rather than letting
resolution fall through to a network download) when the mirror lacks a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conductor_pipeline.corpora.sources import CACHE_DIR_ENV, DATA_DIR_ENV, load_registry
from conductor_pipeline.paths import PROJECT_ROOT

SHARED_DATA_DIR = Path(os.environ.get(DATA_DIR_ENV, PROJECT_ROOT.parent / "shared" / "data"))


def require_shared_data(monkeypatch: pytest.MonkeyPatch, cache_dir: Path, *keys: str) -> Path:
    """Point resolution at the shared mirror (and an empty cache) after checking `keys` are in it."""
    registry = load_registry()
    missing = [key for key in keys if not (SHARED_DATA_DIR / registry[key].path).is_file()]
    if missing:
        pytest.fail(
            f"shared data mirror {SHARED_DATA_DIR} lacks {missing}; set ${DATA_DIR_ENV} to a copy"
        )
    monkeypatch.setenv(DATA_DIR_ENV, str(SHARED_DATA_DIR))
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache_dir))
    return SHARED_DATA_DIR
