"""Where the project's files live, so library code never guesses relative paths, and the one way
to write a JSON file that another step reads as a verdict or manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SQL_DIR = PROJECT_ROOT / "sql"
DATA_DIR = PROJECT_ROOT / "data"
POOLS_DIR = DATA_DIR / "pools"
# Everything a run produces (warehouse, checkpoints, plots) goes under here unless configured.
ARTIFACTS_DIR = PROJECT_ROOT / "artifacts"


def write_json_atomic(path: str | Path, payload: Any) -> None:
    """Write JSON via a temporary file and a rename: a reader sees the old file or the whole new one,
    never half of it (a half-written gate verdict must never read as a pass)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)
