"""Where the project's files live, so library code never guesses relative paths (how artifacts are
written whole or not at all: `conductor_pipeline.files`)."""

from __future__ import annotations

import os
from pathlib import Path

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

