"""Oracle ceilings: how much perfect routing could gain on a pool, before anything is trained.

The oracle solves a question when any worker in the pool does; its ceiling minus the best
single worker is the most a router can add on that pool, however it is trained. Every number
here comes from `sql/oracle_ceiling.sql` run over a relation `outcomes` filtered to the
(sub-)pool in question.

Next to the real pool stands the *null pool*: m independent samples of ONE worker treated as m
workers. Sampling noise alone makes some questions "solved by someone", so the null pool shows
routing headroom that no router can exploit; a real pool's headroom means something only
insofar as it exceeds the null pool's.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np
import polars as pl

from conductor_pipeline.grading.regrade import require_current_grades
from conductor_pipeline.warehouse import Warehouse, sql_row_over_frames

# Sub-pools searched exhaustively up to this size: small sub-pools are the cheap deployments worth
# comparing with the whole pool, and the search grows as (workers choose size).
MAX_SUBPOOL_SIZE = 3
# Null pools of these sizes are shown (capped by the samples recorded), plus one the size of the pool.
NULL_POOL_SIZES = (2, 3)
SAMPLE_SEPARATOR = "#s"  # pseudo-worker names of the null pool: "<worker>#s<sample>"

CEILING_COLUMNS = ("n_questions", "best_worker", "best_single", "oracle", "headroom", "unsolved")
TABLE_SCHEMA = {
    "row": pl.String,
    "kind": pl.String,  # pool | leave_one_out | best_subpool | null_pool
    "size": pl.Int64,
    "workers": pl.String,
    "n_questions": pl.Int64,
    "best_worker": pl.String,
    "best_single": pl.Float64,
    "oracle": pl.Float64,
    "headroom": pl.Float64,
    "unsolved": pl.Int64,
}


def oracle_ceiling(outcomes: pl.DataFrame, workers: Sequence[str] | None = None) -> dict[str, object]:
    """Run sql/oracle_ceiling.sql over `outcomes(question_id, worker, correct)`, filtered to `workers`."""
    frame = outcomes.select("question_id", "worker", "correct")
    if workers is not None:
        frame = frame.filter(pl.col("worker").is_in(list(workers)))
    return sql_row_over_frames("oracle_ceiling", outcomes=frame)


def _matrices(outcomes: pl.DataFrame, workers: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(present, failed) question x worker 0/1 matrices in the order of `workers`."""
    wide = (
        outcomes.filter(pl.col("worker").is_in(list(workers)) & pl.col("correct").is_not_null())
        .with_columns(pl.col("correct").cast(pl.Int8))
        .pivot(on="worker", index="question_id", values="correct", aggregate_function="first")
    )
    values = np.column_stack(
        [wide[w].to_numpy().astype(float) if w in wide.columns else np.full(wide.height, np.nan) for w in workers]
    ) if wide.height else np.zeros((0, len(workers)))
    present = (~np.isnan(values)).astype(float)
    failed = present * (np.nan_to_num(values, nan=1.0) == 0)
    return present, failed


def best_subpools(
    outcomes: pl.DataFrame, workers: Sequence[str], max_size: int = MAX_SUBPOOL_SIZE
) -> dict[int, tuple[str, ...]]:
    """The sub-pool of each size 1..max_size with the highest oracle ceiling.

    The search is exhaustive and vectorised (the same coverage rule as the SQL: only questions
    every member answered); ties go to the larger question count, then to the smaller names.
    The winners' reported numbers come from the SQL.
    """
    names = sorted(workers)
    present, failed = _matrices(outcomes, names)
    best: dict[int, tuple[str, ...]] = {}
    for size in range(1, min(max_size, len(names)) + 1):
        candidates: list[tuple[float, int, tuple[str, ...]]] = []
        if size == 1:
            covered = present.sum(axis=0)
            all_failed = failed.sum(axis=0)
            candidates = [(_oracle(covered[i], all_failed[i]), int(covered[i]), (names[i],)) for i in range(len(names))]
        else:
            for head in combinations(range(len(names)), size - 2):
                p_head = present[:, list(head)].prod(axis=1)
                f_head = failed[:, list(head)].prod(axis=1)
                covered = (present * p_head[:, None]).T @ present
                all_failed = (failed * f_head[:, None]).T @ failed
                start = head[-1] + 1 if head else 0
                for j in range(start, len(names)):
                    for k in range(j + 1, len(names)):
                        members = tuple(names[i] for i in (*head, j, k))
                        candidates.append((_oracle(covered[j, k], all_failed[j, k]), int(covered[j, k]), members))
        candidates = [c for c in candidates if c[1] > 0]
        if candidates:
            best[size] = min(candidates, key=lambda c: (-c[0], -c[1], c[2]))[2]
    return best


def _oracle(covered: float, all_failed: float) -> float:
    return 1.0 - all_failed / covered if covered else float("nan")


def _row(label: str, kind: str, members: Sequence[str], numbers: dict[str, object]) -> dict[str, object]:
    return {
        "row": label,
        "kind": kind,
        "size": len(members),
        "workers": ", ".join(members),
        **{c: numbers[c] for c in CEILING_COLUMNS},
    }


def ceiling_table(
    outcomes: pl.DataFrame, workers: Sequence[str], *, max_subpool_size: int = MAX_SUBPOOL_SIZE
) -> pl.DataFrame:
    """The pool, each leave-one-out sub-pool, and the best sub-pool of each size up to 3."""
    rows = [_row("pool", "pool", workers, oracle_ceiling(outcomes, workers))]
    if len(workers) > 1:
        for left_out in workers:
            rest = [w for w in workers if w != left_out]
            rows.append(_row(f"without {left_out}", "leave_one_out", rest, oracle_ceiling(outcomes, rest)))
    for size, members in best_subpools(outcomes, workers, max_subpool_size).items():
        rows.append(_row(f"best {size}", "best_subpool", members, oracle_ceiling(outcomes, members)))
    return pl.DataFrame(rows, schema=TABLE_SCHEMA, orient="row")


def null_pool_table(
    sample_outcomes: pl.DataFrame, *, pool_size: int, sizes: Sequence[int] = NULL_POOL_SIZES
) -> pl.DataFrame:
    """Null pools: m independent samples of the best multi-sample worker, each sample a "worker".

    `sample_outcomes(question_id, worker, sample, correct)` are scored probe samples. The worker
    is the one with the highest mean single-sample accuracy among those with >= 2 samples.
    `best_single` is that mean single-sample accuracy (what one draw of the worker scores),
    `oracle` is the share of questions at least one of the m samples solved (from the SQL), and
    `headroom` their difference: routing "headroom" that resampling alone produces.
    Empty when no worker has more than one sample (e.g. ZeroEval replay).
    """
    scored = sample_outcomes.filter(pl.col("correct").is_not_null())
    per_worker = (
        scored.group_by("worker")
        .agg(pl.col("sample").n_unique().alias("n_samples"), pl.col("correct").mean().alias("accuracy"))
        .filter(pl.col("n_samples") >= 2)
        .sort(["accuracy", "worker"], descending=[True, False])
    )
    if per_worker.is_empty():
        return pl.DataFrame(schema=TABLE_SCHEMA)
    worker, n_samples = per_worker["worker"][0], per_worker["n_samples"][0]
    own = scored.filter(pl.col("worker") == worker)
    sample_ids = sorted(own["sample"].unique().to_list())
    rows = []
    for m in sorted({s for s in (*sizes, pool_size) if 2 <= s <= n_samples}):
        chosen = sample_ids[:m]
        pseudo = own.filter(pl.col("sample").is_in(chosen)).select(
            "question_id",
            (pl.col("worker") + SAMPLE_SEPARATOR + pl.col("sample").cast(pl.String)).alias("worker"),
            "correct",
        )
        numbers = oracle_ceiling(pseudo)
        covered = pseudo.group_by("question_id").len().filter(pl.col("len") == m)["question_id"]
        mean_single = pseudo.filter(pl.col("question_id").is_in(covered.implode()))["correct"].mean()
        oracle = numbers["oracle"]
        numbers |= {
            "best_worker": worker,
            "best_single": mean_single,
            "headroom": None if oracle is None or mean_single is None else oracle - mean_single,
        }
        members = [f"{worker}{SAMPLE_SEPARATOR}{s}" for s in chosen]
        rows.append(_row(f"null: {m} samples of {worker}", "null_pool", members, numbers))
    return pl.DataFrame(rows, schema=TABLE_SCHEMA, orient="row")


def pool_ceilings(
    warehouse: Warehouse, pool: str, workers: Sequence[str], *, max_subpool_size: int = MAX_SUBPOOL_SIZE
) -> pl.DataFrame:
    """The full table for a probed pool: real (sub-)pools, then the null pools (`StaleGradesError`
    when the pool holds verdicts of an older grader)."""
    require_current_grades(warehouse, pool=pool)
    outcomes = warehouse.query_file("pool_outcomes", {"pool": pool})
    samples = warehouse.query_file("probe_sample_outcomes", {"pool": pool})
    samples = samples.filter(pl.col("worker").is_in(list(workers)))
    real = ceiling_table(outcomes, workers, max_subpool_size=max_subpool_size)
    return pl.concat([real, null_pool_table(samples, pool_size=len(workers))])


def whole_pool_row(table: pl.DataFrame) -> dict[str, object]:
    """The row of the whole pool in a `pool_ceilings` table."""
    return table.filter(pl.col("kind") == "pool").row(0, named=True)


def widest_null_pool_row(table: pl.DataFrame) -> dict[str, object] | None:
    """The null pool with the most samples in a `pool_ceilings` table, or None when it has none."""
    null = table.filter(pl.col("kind") == "null_pool")
    return None if null.is_empty() else null.sort("size").row(-1, named=True)
