"""Grader versions on a real DuckDB file: every verdict records its grader, stale verdicts are
refused by the readers, and the regrade command re-grades them in place."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from conductor_pipeline.grading import GRADER_VERSION
from conductor_pipeline.grading.regrade import StaleGradesError, regrade, require_current_grades, stale_grade_counts
from conductor_pipeline.paths import SQL_DIR
from conductor_pipeline.probing.ceilings import pool_ceilings
from conductor_pipeline.probing.pass_rates import pass_rate_table
from conductor_pipeline.records import CallRecord, Question, WorkflowRecord, stable_id
from conductor_pipeline.warehouse import Warehouse
from tests.builders import make_call

ROOT = Path(__file__).resolve().parents[3]
POOL = "p"
OLD = "1"
# The two-root question and the interest question, with responses the version-1 grader misread.
ROOTS = Question("q-roots", "math", "test", "Solve x^2 - x - 6 = 0.", "3, -2")
INTEREST = Question("q-interest", "math", "test", "What is the balance?", "10455")
ROOTS_RESPONSE = "Factoring gives (x - 3)(x + 2) = 0, so the roots are \\boxed{-2} and \\boxed{3}."
INTEREST_RESPONSE = (
    "Six months at 4% gives $0.02 \\cdot 10,000 = \\boxed{200}$. Then $10,200 + 255 = 10,455$.\n"
    "Final Answer: The final answer is $10,455$. I hope it is correct."
)


def _call(call_id: str, question: Question, response: str | None, *, correct: bool, extracted: str | None = None,
          status: str = "ok", kind: str = "probe", **extra: object) -> CallRecord:
    return CallRecord(
        call_id=call_id, run_id="r1", kind=kind, question_id=question.question_id, worker="w", sample=0,
        subtask=None, response=response, extracted_answer=extracted, correct=correct, status=status, error=None,
        prompt_tokens=None, completion_tokens=None, cost_usd=None, latency_s=None, started_at=None, pool=POOL,
        grader_version=OLD, **extra,
    )


@pytest.fixture
def stale_warehouse(tmp_path: Path) -> Warehouse:
    """Verdicts the version-1 grader wrote: two misread probes, a verdict-only probe, an empty
    call, and a one-step workflow whose last step it misread, plus an unparseable workflow."""
    store = Warehouse(tmp_path / "warehouse.duckdb")
    store.insert("questions", [ROOTS, INTEREST])
    step_id = stable_id("step", "wf-1", 0)
    store.insert("calls", [
        _call("roots", ROOTS, ROOTS_RESPONSE, correct=False, extracted="3"),
        _call("interest", INTEREST, INTEREST_RESPONSE, correct=False, extracted="200"),
        _call("recorded", INTEREST, None, correct=True),  # a replayed verdict: no text to re-read
        _call("empty", ROOTS, "", correct=False, status="empty"),
        _call(step_id, INTEREST, INTEREST_RESPONSE, correct=False, extracted="200", kind="step",
              workflow_id="wf-1", step=0),
    ])
    store.insert("workflows", [
        WorkflowRecord(workflow_id="wf-1", run_id="eval-1", question_id=INTEREST.question_id, conductor="c",
                       raw_text="plan", parse_code="ok", n_steps=1, workers=["w"], final_answer="200",
                       correct=False, grader_version=OLD),
        WorkflowRecord(workflow_id="wf-2", run_id="eval-1", question_id=ROOTS.question_id, conductor="c",
                       raw_text="no plan", parse_code="no_workflow", n_steps=0, correct=False, grader_version=OLD),
    ])
    return store


def test_records_carry_the_grader_of_their_verdict() -> None:
    assert make_call(1, correct=True).grader_version == GRADER_VERSION
    assert make_call(1, correct=False).grader_version == GRADER_VERSION
    assert make_call(1, correct=None).grader_version is None
    assert dataclasses.replace(make_call(1), grader_version=OLD).grader_version == OLD
    workflow = WorkflowRecord(workflow_id="w", run_id="r", question_id="q", conductor="c", raw_text=None,
                              parse_code="no_workflow", n_steps=0, correct=False)
    assert workflow.grader_version == GRADER_VERSION


def test_the_schema_default_is_the_current_grader_and_old_rows_migrate_as_version_1(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    old_schema = (SQL_DIR / "schema.sql").read_text().split("ALTER TABLE calls")[0]  # the tables before the column
    with duckdb.connect(str(path)) as con:
        con.execute(old_schema)
        con.execute("INSERT INTO calls (call_id, run_id, kind, question_id, worker, sample, correct, status, pool) "
                    "VALUES ('before', 'r', 'probe', 'q', 'w', 0, TRUE, 'ok', 'p')")
    store = Warehouse(path)
    store.insert("calls", [{"call_id": "after", "run_id": "r", "kind": "probe", "question_id": "q", "worker": "w",
                            "sample": 1, "correct": True, "status": "ok", "pool": "p"}])
    versions = dict(store.query("SELECT call_id, grader_version FROM calls").iter_rows())
    assert versions == {"before": OLD, "after": GRADER_VERSION}
    defaults = store.query(
        "SELECT table_name, column_default FROM information_schema.columns WHERE column_name = 'grader_version'"
    )
    assert sorted(defaults.iter_rows()) == [("calls", f"'{GRADER_VERSION}'"), ("workflows", f"'{GRADER_VERSION}'")]
    assert stale_grade_counts(store, pool="p") == {"calls": 1, "workflows": 0}


def test_readers_refuse_stale_verdicts_and_name_the_command(stale_warehouse: Warehouse) -> None:
    assert stale_grade_counts(stale_warehouse, pool=POOL) == {"calls": 5, "workflows": 1}
    assert stale_grade_counts(stale_warehouse, run_id="eval-1") == {"calls": 0, "workflows": 2}
    assert stale_grade_counts(stale_warehouse, pool="another") == {"calls": 0, "workflows": 0}
    command = f"python -m conductor_pipeline.grading.regrade --warehouse {stale_warehouse.path} --pool {POOL}"
    for read in (
        lambda: pass_rate_table(stale_warehouse, POOL),
        lambda: pool_ceilings(stale_warehouse, POOL, ["w"]),
        lambda: require_current_grades(stale_warehouse, pool=POOL),
    ):
        with pytest.raises(StaleGradesError, match="older grader") as caught:
            read()
        assert command in str(caught.value)
    with pytest.raises(StaleGradesError, match="run 'eval-1'"):
        require_current_grades(stale_warehouse, run_id="eval-1")
    require_current_grades(stale_warehouse, pool="another")  # nothing stale there


def test_regrade_rereads_stored_responses_in_place(stale_warehouse: Warehouse) -> None:
    before = stale_warehouse.query("SELECT call_id, correct, grader_version FROM calls ORDER BY call_id")

    dry = regrade(stale_warehouse, pool=POOL, dry_run=True)
    assert not dry.written
    assert stale_warehouse.query("SELECT call_id, correct, grader_version FROM calls ORDER BY call_id").equals(before)

    summary = regrade(stale_warehouse, pool=POOL)
    assert summary.written
    assert summary.regraded == {"calls": 3, "workflows": 1}
    # No text: the replayed verdict and the empty call. The unparseable workflow has no call in
    # the pool (no conductor call was recorded for it), so only a whole-warehouse regrade reaches it.
    assert summary.restamped == {"calls": 2, "workflows": 0}
    assert summary.to_correct == {"calls": 3, "workflows": 1} and summary.to_wrong == {"calls": 0, "workflows": 0}
    assert "flipped 3 wrong -> correct" in summary.describe()

    calls = {row["call_id"]: row for row in stale_warehouse.query("SELECT * FROM calls").iter_rows(named=True)}
    assert (calls["roots"]["extracted_answer"], calls["roots"]["correct"]) == ("-2, 3", True)
    assert (calls["interest"]["extracted_answer"], calls["interest"]["correct"]) == ("$10,455$", True)
    assert calls["recorded"]["correct"] is True and calls["empty"]["correct"] is False
    assert {row["grader_version"] for row in calls.values()} == {GRADER_VERSION}
    require_current_grades(stale_warehouse, pool=POOL)
    rates = pass_rate_table(stale_warehouse, POOL)
    assert dict(zip(rates["question_id"], rates["successes"])) == {"q-interest": 2, "q-roots": 1}

    rest = regrade(stale_warehouse)
    assert rest.regraded == {"calls": 0, "workflows": 0} and rest.restamped == {"calls": 0, "workflows": 1}
    workflows = {row["workflow_id"]: row for row in stale_warehouse.query("SELECT * FROM workflows").iter_rows(named=True)}
    assert (workflows["wf-1"]["final_answer"], workflows["wf-1"]["correct"]) == ("$10,455$", True)
    assert (workflows["wf-2"]["correct"], workflows["wf-2"]["grader_version"]) == (False, GRADER_VERSION)
    require_current_grades(stale_warehouse, run_id="eval-1")


def test_the_regrade_command_on_a_warehouse_file(stale_warehouse: Warehouse) -> None:
    command = [sys.executable, "-m", "conductor_pipeline.grading.regrade", "--warehouse", str(stale_warehouse.path)]
    dry = subprocess.run([*command, "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    assert "dry run: nothing written" in dry.stdout
    assert "calls: 3 re-graded from their text, 2 without text kept their verdict; flipped 3 wrong -> correct" in dry.stdout
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    assert "workflows: 1 re-graded from their text, 1 without text kept their verdict; flipped 1 wrong -> correct" in done.stdout
    assert "gold '3, -2', read '3' -> '-2, 3', now correct" in done.stdout
    assert stale_grade_counts(stale_warehouse) == {"calls": 0, "workflows": 0}
    missing = subprocess.run([*command[:-1], str(stale_warehouse.path) + ".absent"], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
    assert missing.returncode == 2 and "no warehouse file" in missing.stderr


def test_a_stale_verdict_without_its_question_is_an_error(tmp_path: Path) -> None:
    store = Warehouse(tmp_path / "w.duckdb")
    store.insert("calls", [_call("orphan", ROOTS, ROOTS_RESPONSE, correct=False)])
    with pytest.raises(ValueError, match="call_id 'orphan', question 'q-roots'.*materialize `questions`"):
        regrade(store)
    assert stale_grade_counts(store) == {"calls": 1, "workflows": 0}  # nothing written
