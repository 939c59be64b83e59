"""Where the project's files live, so library code never guesses relative paths, and the one way
to write a JSON file that another step reads as a verdict or manifest."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SQL_DIR = PROJECT_ROOT / "sql"
DATA_DIR = PROJECT_ROOT / "data"
POOLS_DIR = DATA_DIR / "pools"
# Everything a run produces (warehouse, checkpoints, verdicts, manifests, models, plots) goes under
# the artifacts root: this folder, unless $CORYPHAEUS_ARTIFACTS names another one.
ARTIFACTS_DIR = PROJECT_ROOT / "artifacts"
ARTIFACTS_ENV = "CORYPHAEUS_ARTIFACTS"


def artifacts_root() -> Path:
    """`$CORYPHAEUS_ARTIFACTS`, else artifacts/ in the project; read at each call, not at import.

    On a cluster every step runs in its own pod with its own copy of the project, so files one
    step writes for another (a probe manifest, a gate verdict, a checkpoint) must live on storage
    every pod mounts: the deployment points this variable at that volume.
    """
    return Path(os.environ.get(ARTIFACTS_ENV) or ARTIFACTS_DIR)


def write_json_atomic(path: str | Path, payload: Any) -> None:
    """Write JSON via a temporary file and a rename: a reader sees the old file or the whole new one,
    never half of it (a half-written gate verdict must never read as a pass)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)
