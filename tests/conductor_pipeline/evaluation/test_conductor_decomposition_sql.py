"""`sql/conductor_decomposition.sql` on hand-made outcomes shaped like Coryphaeus's published
prompted-conductor result (docs/ARCHITECTURE.md, References).

150 questions; q9 (best single) solves 88 = 58.7%; the union of solvers covers 99 = 66.0%;
the conductor gets 71 right = 47.3%; 22 workflows (14.7%) do not parse; 71 of 128 parsed = 55.5%.
Of the 99 solvable questions: 71 reached a solver, 12 used only non-solvers, 16 did not parse.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from conductor_pipeline.warehouse import load_sql

N_QUESTIONS = 150


def _qid(i: int) -> str:
    return f"test/q/{i:03d}.json"


def coryphaeus_published_shape() -> tuple[list[dict], list[dict]]:
    solves = {
        "q9": set(range(0, 88)),  # 88 / 150: the best single worker
        "q4": set(range(19, 99)),  # 80 / 150
        "q2": set(range(0, 40)),  # 40 / 150
    }
    outcomes = [
        {"question_id": _qid(i), "worker": w, "correct": i in solved}
        for w, solved in solves.items()
        for i in range(N_QUESTIONS)
    ]
    conductor = []
    for i in range(N_QUESTIONS):
        if 0 <= i < 12:  # solvable (q9, q2), routed to q4 alone: only non-solvers
            row = ("ok", ["q4"], i < 3)
        elif 12 <= i < 28:  # solvable, unparseable
            row = ("json_decode", [], False)
        elif 28 <= i < 99:  # solvable, reached a solver (71)
            row = ("ok", ["q9"] if i < 88 else ["q4", "q9"], i < 94)
        elif 99 <= i < 105:  # unsolvable, unparseable
            row = ("no_workflow", [], False)
        else:  # unsolvable, parsed
            row = ("ok", ["q2"], i < 107)
        code, workers, correct = row
        conductor.append({"question_id": _qid(i), "parse_code": code, "correct": correct, "workers": workers})
    return outcomes, conductor


def run_sql(outcomes: list[dict], conductor: list[dict]) -> dict:
    con = duckdb.connect()
    try:
        con.register("outcomes", pa.Table.from_pylist(outcomes))
        schema = pa.schema(
            [("question_id", pa.string()), ("parse_code", pa.string()), ("correct", pa.bool_()),
             ("workers", pa.list_(pa.string()))]
        )
        con.register("conductor_outcomes", pa.Table.from_pylist(conductor, schema=schema))
        rows = con.execute(load_sql("conductor_decomposition")).fetchall()
        columns = [d[0] for d in con.description]
    finally:
        con.close()
    assert len(rows) == 1
    return dict(zip(columns, rows[0], strict=True))


def test_reproduces_the_coryphaeus_published_shape():
    result = run_sql(*coryphaeus_published_shape())
    assert result["n_questions"] == 150
    assert result["best_worker"] == "q9"
    assert round(result["best_single"] * 100, 1) == 58.7
    assert round(result["oracle"] * 100, 1) == 66.0
    assert round(result["conductor"] * 100, 1) == 47.3
    assert round(result["gap"] * 100, 1) == -11.3
    assert round(result["unparseable"] * 100, 1) == 14.7
    assert round(result["parsed_accuracy"] * 100, 1) == 55.5
    assert result["solvable"] == 99
    assert result["solvable_reached_solver"] == 71
    assert result["solvable_only_non_solvers"] == 12
    assert result["solvable_unparseable"] == 16
    assert result["conductor_correct_on_solvable"] == 69
    for count in ("n_questions", "solvable", "conductor_correct_on_solvable", "solvable_unparseable",
                  "solvable_reached_solver", "solvable_only_non_solvers"):
        assert isinstance(result[count], int), count
    for share in ("best_single", "oracle", "conductor", "unparseable", "parsed_accuracy"):
        assert 0.0 <= result[share] <= 1.0


def test_only_questions_present_in_both_count():
    outcomes, conductor = coryphaeus_published_shape()
    # Solo outcomes for 10 questions the conductor never saw, and a conductor row with no solo data.
    outcomes += [{"question_id": f"extra/{i}", "worker": "q2", "correct": True} for i in range(10)]
    conductor.append({"question_id": "orphan", "parse_code": "ok", "correct": True, "workers": ["q2"]})
    result = run_sql(outcomes, conductor)
    assert result["n_questions"] == 150
    assert round(result["oracle"] * 100, 1) == 66.0


def test_ties_for_best_worker_go_to_the_smallest_name():
    outcomes = [
        {"question_id": "a", "worker": "zeta", "correct": True},
        {"question_id": "a", "worker": "alpha", "correct": True},
        {"question_id": "b", "worker": "zeta", "correct": False},
        {"question_id": "b", "worker": "alpha", "correct": False},
    ]
    conductor = [
        {"question_id": "a", "parse_code": "ok", "correct": True, "workers": ["zeta"]},
        {"question_id": "b", "parse_code": "schema", "correct": False, "workers": []},
    ]
    result = run_sql(outcomes, conductor)
    assert result["best_worker"] == "alpha"
    assert result["gap"] == pytest.approx(0.0)
    assert result["parsed_accuracy"] == pytest.approx(1.0)
    assert result["solvable_reached_solver"] == 1
