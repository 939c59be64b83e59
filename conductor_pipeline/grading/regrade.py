"""Re-grade stored verdicts with the current grader, and refuse to mix graders silently.

Every `calls` and `workflows` verdict carries the `grader_version` that gave it. When the grader
changes, stored verdicts go stale: pass rates, ceilings and eval tables refuse to read a pool or
run holding stale verdicts (`require_current_grades` raises `StaleGradesError`, whose message is
the command to run), and this command re-grades them in place:

    python -m conductor_pipeline.grading.regrade --warehouse PATH [--pool NAME] [--dry-run]

It re-extracts and re-grades every stale row that has response text, exactly as the writer
would now (probe calls that returned ok or truncated text, workflow steps, and each workflow
from the response of its last step); rows with no text (recorded verdicts, empty or failed
calls, unparseable workflows) keep their verdict and only get the new version. Grading runs
without the warehouse lock; the writes land in one transaction and touch only rows still stale.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa

from conductor_pipeline.grader_version import GRADER_VERSION
from conductor_pipeline.grading.equivalence import grade_many
from conductor_pipeline.records import stable_id
from conductor_pipeline.warehouse import Warehouse, load_sql

REGRADE_MODULE = "conductor_pipeline.grading.regrade"
# Probe calls are graded from their text only with these statuses; any other verdict is not the grader's.
_PROBE_STATUSES_GRADED_FROM_TEXT = ("ok", "truncated")
WORKFLOW_PARSED = "ok"
EXAMPLES_KEPT = 5


class StaleGradesError(RuntimeError):
    """Verdicts of an older grader are stored where current ones are about to be read."""


class RegradeError(ValueError):
    """A stale verdict cannot be re-graded (its question's gold is not in the warehouse)."""


def regrade_command(warehouse: Warehouse, pool: str | None = None) -> str:
    """The shell command that re-grades `warehouse` (one pool of it when `pool` is given)."""
    command = f"python -m {REGRADE_MODULE} --warehouse {warehouse.path}"
    return command + (f" --pool {pool}" if pool else "")


def stale_grade_counts(warehouse: Warehouse, *, pool: str | None = None, run_id: str | None = None) -> dict[str, int]:
    """{"calls": n, "workflows": m}: verdicts not given by the current grader."""
    row = warehouse.query_file("stale_grades", {"version": GRADER_VERSION, "pool": pool, "run_id": run_id})
    return {"calls": int(row["calls"][0]), "workflows": int(row["workflows"][0])}


def require_current_grades(warehouse: Warehouse, *, pool: str | None = None, run_id: str | None = None) -> None:
    """Raise `StaleGradesError` when the pool or run holds verdicts of another grader version."""
    counts = stale_grade_counts(warehouse, pool=pool, run_id=run_id)
    if counts["calls"] or counts["workflows"]:
        scope = f"pool {pool!r}" if pool else f"run {run_id!r}" if run_id else "the warehouse"
        raise StaleGradesError(
            f"{counts['calls']} calls and {counts['workflows']} workflows of {scope} in {warehouse.path} were graded "
            f"by an older grader than version {GRADER_VERSION}; reading them would mix two graders' verdicts. "
            f"Re-grade them first: {regrade_command(warehouse, pool)}"
        )


@dataclass(frozen=True, slots=True)
class Flip:
    """One verdict the current grader reverses."""

    table: str
    key: str
    gold: str
    before: str | None  # the answer the old grader read
    after: str | None  # the answer the current grader reads
    now_correct: bool


@dataclass(slots=True)
class RegradeSummary:
    """What one re-grade did, per table."""

    regraded: dict[str, int] = field(default_factory=lambda: {"calls": 0, "workflows": 0})
    restamped: dict[str, int] = field(default_factory=lambda: {"calls": 0, "workflows": 0})
    to_correct: dict[str, int] = field(default_factory=lambda: {"calls": 0, "workflows": 0})
    to_wrong: dict[str, int] = field(default_factory=lambda: {"calls": 0, "workflows": 0})
    examples: list[Flip] = field(default_factory=list)
    written: bool = False

    def describe(self) -> str:
        lines = [f"grader version {GRADER_VERSION}" + ("" if self.written else " (dry run: nothing written)")]
        for table in ("calls", "workflows"):
            lines.append(
                f"{table}: {self.regraded[table]} re-graded from their text, {self.restamped[table]} without text "
                f"kept their verdict; flipped {self.to_correct[table]} wrong -> correct, "
                f"{self.to_wrong[table]} correct -> wrong"
            )
        for flip in self.examples:
            lines.append(
                f"  {flip.table} {flip.key}: gold {flip.gold!r}, read {flip.before!r} -> {flip.after!r}, "
                f"now {'correct' if flip.now_correct else 'wrong'}"
            )
        return "\n".join(lines)


def _last_step_responses(warehouse: Warehouse, workflows: pl.DataFrame) -> list[str | None]:
    """The response of each workflow's last top-level step (None for unparsed or failed runs)."""
    step_ids = [
        stable_id("step", row["workflow_id"], row["n_steps"] - 1)
        if row["parse_code"] == WORKFLOW_PARSED and not row["infra_failure"] and row["n_steps"] > 0
        else None
        for row in workflows.iter_rows(named=True)
    ]
    wanted = [step for step in step_ids if step is not None]
    found = warehouse.query_file("call_responses_by_ids", {"ids": wanted}) if wanted else None
    responses = dict(zip(found["call_id"], found["response"], strict=True)) if found is not None else {}
    return [responses.get(step) if step is not None else None for step in step_ids]


def _regrade_frame(
    frame: pl.DataFrame,
    responses: Sequence[str | None],
    *,
    table: str,
    key: str,
    answer_column: str,
    summary: RegradeSummary,
    processes: int,
) -> pa.Table:
    """(key, answer, correct) for every stale row: re-graded where there is text, else as stored."""
    with_text = [index for index, response in enumerate(responses) if response]
    golds = frame["gold"].to_list()
    ungradable = [index for index in with_text if golds[index] is None]
    if ungradable:
        first = frame.row(ungradable[0], named=True)
        raise RegradeError(
            f"{len(ungradable)} stale {table} rows have no question in `questions` (e.g. {key} {first[key]!r}, "
            f"question {first['question_id']!r}): materialize `questions` first"
        )
    grades = grade_many([responses[i] for i in with_text], [golds[i] for i in with_text], processes=processes)
    answers = frame[answer_column].to_list()
    verdicts = frame["correct"].to_list()
    keys = frame[key].to_list()
    for index, graded in zip(with_text, grades, strict=True):
        if graded.correct != verdicts[index]:
            bucket = summary.to_correct if graded.correct else summary.to_wrong
            bucket[table] += 1
            if len(summary.examples) < EXAMPLES_KEPT:
                summary.examples.append(
                    Flip(table, keys[index], golds[index], answers[index], graded.extracted, graded.correct)
                )
        answers[index], verdicts[index] = graded.extracted, graded.correct
    summary.regraded[table] += len(with_text)
    summary.restamped[table] += frame.height - len(with_text)
    return pa.table(
        {key: keys, answer_column: pa.array(answers, pa.string()), "correct": pa.array(verdicts, pa.bool_())}
    )


def regrade(
    warehouse: Warehouse, *, pool: str | None = None, dry_run: bool = False, processes: int = 2
) -> RegradeSummary:
    """Re-grade every stale verdict (of one pool when given) with the current grader."""
    summary = RegradeSummary()
    params = {"version": GRADER_VERSION, "pool": pool}
    calls = warehouse.query_file("stale_graded_calls", params)
    workflows = warehouse.query_file("stale_graded_workflows", params)
    call_texts = [
        response if kind != "probe" or status in _PROBE_STATUSES_GRADED_FROM_TEXT else None
        for kind, status, response in zip(calls["kind"], calls["status"], calls["response"], strict=True)
    ]
    regraded_calls = _regrade_frame(
        calls, call_texts, table="calls", key="call_id", answer_column="extracted_answer",
        summary=summary, processes=processes,
    )
    regraded_workflows = _regrade_frame(
        workflows, _last_step_responses(warehouse, workflows), table="workflows", key="workflow_id",
        answer_column="final_answer", summary=summary, processes=processes,
    )
    if dry_run or (calls.is_empty() and workflows.is_empty()):
        return summary
    with warehouse.connect() as con:
        con.begin()
        try:
            for table, regraded in (("calls", regraded_calls), ("workflows", regraded_workflows)):
                con.register("regraded", regraded)
                try:
                    con.execute(load_sql(f"regrade_{table}"), {"version": GRADER_VERSION})
                finally:
                    con.unregister("regraded")
            con.commit()
        except BaseException:
            con.rollback()
            raise
    summary.written = True
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {REGRADE_MODULE}",
        description=f"Re-grade stored verdicts with the current grader (version {GRADER_VERSION}).",
    )
    parser.add_argument("--warehouse", required=True, type=Path, help="the DuckDB warehouse file")
    parser.add_argument("--pool", default=None, help="only this pool's calls and workflows")
    parser.add_argument("--dry-run", action="store_true", help="count the flips, write nothing")
    parser.add_argument("--processes", type=int, default=2, help="math-verify worker processes")
    args = parser.parse_args(argv)
    if not args.warehouse.is_file():
        parser.error(f"no warehouse file at {args.warehouse}")
    summary = regrade(Warehouse(args.warehouse), pool=args.pool, dry_run=args.dry_run, processes=args.processes)
    print(summary.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
