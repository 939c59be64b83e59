"""Two `make run`s in the same checkout, started together: the second waits for the first.

`python -m assets.main` holds the artifacts root's run lock from before it plans until it exits;
a second run on the same artifacts waits, saying every few seconds which process holds it, then
plans against what the first left (everything fresh: nothing is recomputed). Two runs writing the
same checkpoint folder, warm start and tables at once could not both be right; one after the
other, both are, and the warehouse and tables are those of one run.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import duckdb
import pytest

from tests.reliability.main_runs import SMALL_RUN, MainRun, RunFolder, read_outcome, run_to_end, warehouse_problems
from tests.shared_data import require_shared_data

FIRST_JOBS = MainRun("corpora and probes", extra_args=("--only", "corpora_job", "--only", "probe_job"))
WAIT_S = 600


def start_together(folder: RunFolder, run: MainRun) -> tuple[str, str]:
    """Start two runs at once on one folder; both must exit 0. Returns their outputs, first to hold the lock first."""
    processes = [(folder.start(run, folder.root / f"run{i}.log"), folder.root / f"run{i}.log") for i in range(2)]
    for process, log in processes:
        assert process.wait(timeout=WAIT_S) == 0, log.read_text(errors="replace")[-4000:]
    outputs = [log.read_text(errors="replace") for _, log in processes]
    return tuple(sorted(outputs, key=lambda text: "waiting" in text))  # type: ignore[return-value]


def test_two_runs_started_together_run_one_after_the_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train",
                        "zeroeval_outputs")
    folder = RunFolder(tmp_path / "run").prepare()
    first, second = start_together(folder, FIRST_JOBS)
    waited = re.search(r"waiting \d+s for the artifacts folder .* held by PID (\d+) on \S+ \(started [^)]*", second)
    assert waited, second[-3000:]
    assert "== probe_job: ok" in first
    assert "== corpora_job: nothing to do" in second and "== probe_job: nothing to do" in second
    assert not warehouse_problems(folder)
    with duckdb.connect(str(folder.artifacts / "warehouse.duckdb"), read_only=True) as con:
        questions, calls = con.execute("SELECT (SELECT count(*) FROM questions), (SELECT count(*) FROM calls)").fetchone()
    assert questions == 21_292 and calls == 12_240  # one run's rows, each once


@pytest.mark.slow
def test_two_small_runs_started_together_end_as_one_uninterrupted_run(tmp_path: Path, monkeypatch) -> None:
    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train",
                        "zeroeval_outputs")
    reference = RunFolder(tmp_path / "reference").prepare()
    run_to_end(reference, SMALL_RUN, reference.root / "run.log")
    folder = RunFolder(tmp_path / "together").prepare()
    started = time.monotonic()
    _, second = start_together(folder, SMALL_RUN)
    assert "waiting" in second and time.monotonic() - started > 0
    assert read_outcome(folder).differences(read_outcome(reference)) == []
    assert not warehouse_problems(folder)
