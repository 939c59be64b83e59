"""Training rows for the world model: from the warehouse, or straight from the replay telemetry.

The world model learns from one frame per scored call with these columns (the *training frame*):

    question_id, worker, subtask, problem, corpus, subject, level, correct,
    cost_usd, latency_s, tokens_estimated, visible_steps

`subtask` is the text the worker was asked; `problem` is the whole question (a subtask equal to
it is a whole-question call, and only then are subject and level features). `visible_steps` is
how many earlier step results the call saw (0 for a probe; null when unknown). The warehouse reader
is the production path; the replay reader builds the same frame from the ZeroEval recordings
so the model can be developed and benchmarked before probing has filled the warehouse.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

import polars as pl

from conductor_pipeline.pools.backends.replay import ZEROEVAL_QUESTION_ID, only_output
from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.warehouse import Warehouse, load_sql

TRAINING_COLUMNS: dict[str, pl.DataType] = {
    "question_id": pl.String(),
    "worker": pl.String(),
    "subtask": pl.String(),
    "problem": pl.String(),
    "corpus": pl.String(),
    "subject": pl.String(),
    "level": pl.Int32(),
    "correct": pl.Boolean(),
    "cost_usd": pl.Float64(),
    "latency_s": pl.Float64(),
    "tokens_estimated": pl.Boolean(),
    "visible_steps": pl.Int32(),
    # Where a warehouse row comes from: probe | rollout (a training rollout's step) | eval; null elsewhere.
    "source": pl.String(),
}


def normalize_training_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame with every training column present and typed (absent optional columns are null)."""
    missing_required = {"question_id", "worker", "subtask"} - set(frame.columns)
    if missing_required:
        raise ValueError(f"a training frame needs columns {sorted(missing_required)}")
    return frame.select(
        (pl.col(name).cast(dtype) if name in frame.columns else pl.lit(None, dtype=dtype)).alias(name)
        for name, dtype in TRAINING_COLUMNS.items()
    )


def rows_by_source(frame: pl.DataFrame) -> dict[str, int]:
    """How many scored training rows came from probes, training rollouts and evaluations
    ('other' for rows without a source, e.g. the replay recordings)."""
    scored = frame.filter(pl.col("correct").is_not_null())
    counts = scored.group_by(pl.col("source").fill_null("other")).len().sort("source")
    return {row["source"]: int(row["len"]) for row in counts.iter_rows(named=True)}


def load_training_frame(
    warehouse: Warehouse, workers: Collection[str] | None = None, *, pool: str | None = None, probes_only: bool = False
) -> pl.DataFrame:
    """Every scored probe and workflow-step call, joined to its question (sql/world_model_training_rows.sql);
    with `workers`, only theirs. A pool's own W reads its seats' rows only: the warehouse also holds
    other pools' probes, test models' among them, which nothing a conductor trains on may learn from.

    With `pool`, only the rows that pool's runs wrote. Every pool that seats a worker probes it, so
    across pools a worker's rows would count once per pool probed before this one, and a W would
    depend on which pools the warehouse had seen.

    `probes_only` keeps the probe rows: the rows every W whose numbers a conductor reads is fitted on.
    Rollout and eval steps are whatever runs wrote to the warehouse before (other seeds, recipes,
    reruns), so a W fitted on them would make one seed's prompts depend on the seeds run before it.
    """
    frame = normalize_training_frame(warehouse.query(load_sql("world_model_training_rows"), {"pool": pool}))
    if probes_only:
        frame = frame.filter(pl.col("source") == "probe")
    return frame if workers is None else frame.filter(pl.col("worker").is_in(list(workers)))


def replay_training_frame(
    telemetry_path: str | Path,
    questions: Mapping[str, object],
    *,
    seats: Mapping[str, WorkerSeat] | None = None,
    labels: str = "grader",
    grade_processes: int = 2,
) -> pl.DataFrame:
    """The ZeroEval recordings as a training frame: one row per (model file, question).

    `questions` maps question_id -> conductor_pipeline.records.Question (problem, subject, level,
    gold). With `seats` (e.g. the replay-zeroeval-all pool), each model file becomes the name of
    the seat whose `model` it is, and model files no seat serves are dropped; without, the worker
    is the model file. `labels="grader"` grades every response with the project grader (about
    half a minute for 83k rows); `labels="ze_matched"` uses ZeroEval's first-number match, a
    development placeholder only.
    """
    raw = pl.read_parquet(
        telemetry_path,
        columns=["benchmark", "model_file", "math_unique_id", "gsm8k_test_index", "output", "ze_matched"],
    ).with_columns(ZEROEVAL_QUESTION_ID)
    if seats is not None:
        seat_of_model = {seat.model: name for name, seat in seats.items() if seat.replay_source == "zeroeval"}
        raw = raw.filter(pl.col("model_file").is_in(list(seat_of_model))).with_columns(
            pl.col("model_file").replace_strict(seat_of_model, return_dtype=pl.String)
        )
    missing = set(raw["question_id"].unique()) - set(questions)
    if missing:
        raise KeyError(f"{len(missing)} telemetry questions are not in `questions`, e.g. {sorted(missing)[:3]}")
    ordered = [questions[qid] for qid in raw["question_id"]]
    if labels == "grader":
        from conductor_pipeline.grading import grade_many  # noqa: PLC0415 (heavy: math-verify workers)

        responses = [only_output(text) for text in raw["output"]]
        grades = grade_many(responses, [q.answer for q in ordered], processes=grade_processes)  # type: ignore[attr-defined]
        correct = pl.Series("correct", [g.correct for g in grades], dtype=pl.Boolean)
    elif labels == "ze_matched":
        correct = raw["ze_matched"].alias("correct")
    else:
        raise ValueError(f"labels must be 'grader' or 'ze_matched', got {labels!r}")
    problems = [q.problem for q in ordered]  # type: ignore[attr-defined]
    frame = pl.DataFrame(
        {
            "question_id": raw["question_id"],
            "worker": raw["model_file"],
            "subtask": problems,
            "problem": problems,
            "corpus": [q.corpus for q in ordered],  # type: ignore[attr-defined]
            "subject": [q.subject for q in ordered],  # type: ignore[attr-defined]
            "level": [q.level for q in ordered],  # type: ignore[attr-defined]
            "correct": correct,
            "tokens_estimated": [True] * raw.height,
            "visible_steps": [0] * raw.height,  # each recording answers the question alone
        },
        schema_overrides={"subject": pl.String, "level": pl.Int32, "visible_steps": pl.Int32},
    )
    return normalize_training_frame(frame)
