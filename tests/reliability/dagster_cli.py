"""Run `dagster asset materialize` as a separate process, the way a user or a scheduler would.

Each run gets its own Dagster instance (DAGSTER_HOME) and warehouse (CORYPHAEUS_WAREHOUSE, or the
one under the artifacts root) under a test's tmp dir; the pool file is named by CORYPHAEUS_POOL, which `assets.definitions.defs` reads
when the CLI loads the definitions (the probe partitions follow the pool).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from conductor_pipeline.paths import DATA_DIR, PROJECT_ROOT

DAGSTER_CLI = Path(sys.executable).parent / "dagster"
# Dagster import + run on a loaded 2-core box; generous, only a hung run gets near it.
CLI_TIMEOUT_S = 300


def dagster_env(home: Path, warehouse: Path | None, pool: str | Path | None = None, **extra: str) -> dict[str, str]:
    """Environment of a CLI run: its own instance (telemetry off, from data/dagster.yaml) and warehouse
    (None: the default one under $CORYPHAEUS_ARTIFACTS)."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA_DIR / "dagster.yaml", home / "dagster.yaml")
    # Create the instance's storage once, here: two CLI processes creating a fresh SQLite schema at
    # the same moment race in alembic ("more than one head"), which is Dagster's, not the project's.
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs(limit=1)
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    env.pop("CORYPHAEUS_WAREHOUSE", None)
    if warehouse is not None:
        env["CORYPHAEUS_WAREHOUSE"] = str(warehouse)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    if pool is not None:
        env["CORYPHAEUS_POOL"] = str(pool)
    return env


def start_materialize(
    select: str,
    env: Mapping[str, str],
    *,
    partition_range: str | None = None,
    run_config: dict | None = None,
    log_path: Path,
) -> subprocess.Popen[bytes]:
    """Start one `dagster asset materialize` process; its output goes to `log_path`."""
    argv = [str(DAGSTER_CLI), "asset", "materialize", "-m", "assets.definitions", "--select", select]
    if partition_range is not None:
        argv += ["--partition-range", partition_range]
    if run_config is not None:
        argv += ["--config-json", json.dumps(run_config)]
    with log_path.open("wb") as log:
        return subprocess.Popen(argv, cwd=PROJECT_ROOT, env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def materialize(select: str, env: Mapping[str, str], *, log_path: Path, **options: object) -> str:
    """Run one materialization to the end; returns its output, raising with it on failure."""
    process = start_materialize(select, env, log_path=log_path, **options)  # type: ignore[arg-type]
    code = process.wait(timeout=CLI_TIMEOUT_S)
    output = log_path.read_text(errors="replace")
    if code != 0:
        raise AssertionError(f"dagster asset materialize --select {select} exited {code}:\n{output[-4000:]}")
    return output
