"""Where the project's committed files live, so library code never guesses relative paths."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SQL_DIR = PROJECT_ROOT / "sql"
DATA_DIR = PROJECT_ROOT / "data"
POOLS_DIR = DATA_DIR / "pools"
# Everything a run produces (warehouse, checkpoints, plots) goes under here unless configured.
ARTIFACTS_DIR = PROJECT_ROOT / "artifacts"
