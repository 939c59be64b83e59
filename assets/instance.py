"""This project's Dagster instance, for the headless entry points (`python -m assets.main`,
`assets.evaluate_checkpoint`, `assets.results`, `assets.seeds`).

`make` exports DAGSTER_HOME=.dagster_home; a researcher who types `python -m assets....` in a shell
without it gets the same instance (so `make ui` shows the runs) instead of Dagster's
DagsterHomeNotSetError.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import dagster as dg
from filelock import FileLock

from conductor_pipeline.paths import DATA_DIR, PROJECT_ROOT

DAGSTER_HOME_ENV = "DAGSTER_HOME"
# Where the Makefile points DAGSTER_HOME, and the settings `make setup` copies there.
PROJECT_DAGSTER_HOME = PROJECT_ROOT / ".dagster_home"
INSTANCE_SETTINGS = DATA_DIR / "dagster.yaml"
# Held while a process creates the instance's storage in $DAGSTER_HOME.
INSTANCE_SETUP_LOCK = ".instance-setup.lock"


def dagster_home(say: Callable[[str], object] = print) -> Path:
    """$DAGSTER_HOME, or the project's `.dagster_home` (prepared as `make setup` does) when it is unset;
    exported, so the runs' own processes open the same instance."""
    home = os.environ.get(DAGSTER_HOME_ENV)
    if home:
        return Path(home)
    PROJECT_DAGSTER_HOME.mkdir(parents=True, exist_ok=True)
    settings = PROJECT_DAGSTER_HOME / "dagster.yaml"
    if not settings.exists():
        shutil.copyfile(INSTANCE_SETTINGS, settings)
    os.environ[DAGSTER_HOME_ENV] = str(PROJECT_DAGSTER_HOME)
    say(f"{DAGSTER_HOME_ENV} is not set: using {PROJECT_DAGSTER_HOME}, as make does")
    return PROJECT_DAGSTER_HOME


def open_instance(say: Callable[[str], object] = print) -> dg.DagsterInstance:
    """This project's Dagster instance, its storage created under a lock in its folder: two processes
    creating a fresh SQLite instance at the same moment race in Dagster's schema migration, and one
    of them crashes."""
    home = dagster_home(say)
    with FileLock(str(home / INSTANCE_SETUP_LOCK)):
        instance = dg.DagsterInstance.get()
        instance.get_runs(limit=1)  # creates the storage if it is not there yet
    return instance
