"""Every arm against the best single worker, paired on the questions both reached.

The question each row of the arm table exists to answer is paired: does this arm beat the best
single worker (chosen on the train split: the `best_single` arm) *on the same questions*? Each arm
gets `stats.compare_paired` against it: the accuracy difference with a bootstrap interval over
questions, the exact McNemar test and APGR against the oracle arm. A conductor's gap is also split
into accuracy points that add up to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from conductor_pipeline.evaluation.arms import ConductorArm, SoloArm
from conductor_pipeline.evaluation.routers import BestSingleRouter, OracleRouter, solo_verdicts
from conductor_pipeline.stats import (
    DEFAULT_BOOTSTRAP_RESAMPLES,
    DEFAULT_CONFIDENCE,
    PairedComparison,
    compare_paired,
    holm_family,
    question_resamples,
)

REFERENCE_ARM = BestSingleRouter.name


@dataclass(frozen=True)
class PairedSettings:
    """How every paired interval of one report is formed (one seed: the same draws pair them all)."""

    confidence: float = DEFAULT_CONFIDENCE
    n_resamples: int = DEFAULT_BOOTSTRAP_RESAMPLES
    seed: int = 0

    def resamples(self, n_questions: int) -> np.ndarray:
        return question_resamples(n_questions, self.n_resamples, self.seed)


DEFAULT_PAIRED = PairedSettings()


def question_scores(workflows: pl.DataFrame) -> pl.DataFrame:
    """(arm, question_id, score): each arm's accuracy per question, the mean over its scored
    repeats (infrastructure failures are not scored), so a question's repeats stay one unit."""
    return (
        workflows.filter(~pl.col("infra_failure") & pl.col("correct").is_not_null())
        .group_by("arm", "question_id")
        .agg(pl.col("correct").cast(pl.Float64).mean().alias("score"))
        .sort("arm", "question_id")  # group_by's order is arbitrary; the table is written as is
    )


def aligned_scores(scores: pl.DataFrame, arms: Sequence[str]) -> tuple[list[str], list[np.ndarray]]:
    """The questions every one of `arms` reached (sorted) and each arm's scores on them, aligned."""
    wide = (
        scores.filter(pl.col("arm").is_in(list(arms)))
        .pivot(on="arm", index="question_id", values="score")
        .drop_nulls()
        .sort("question_id")
    )
    missing = [arm for arm in arms if arm not in wide.columns]
    if missing or wide.height == 0:
        return [], [np.empty(0) for _ in arms]
    return wide["question_id"].to_list(), [wide[arm].to_numpy() for arm in arms]


def compare_with_reference(
    workflows: pl.DataFrame,
    *,
    reference: str = REFERENCE_ARM,
    oracle: str | None = OracleRouter.name,
    settings: PairedSettings = DEFAULT_PAIRED,
) -> dict[str, PairedComparison]:
    """Every arm other than `reference` against it, on the questions the arm, the reference and
    (for APGR) the oracle all reached; arms sharing no question with it are left out. The verdicts are
    Holm-adjusted over all of them: one table, many arms against one reference."""
    scores = question_scores(workflows)
    arms = sorted(set(scores["arm"].to_list()) - {reference})
    with_oracle = oracle is not None and oracle in set(scores["arm"].to_list())
    comparisons: dict[str, PairedComparison] = {}
    for arm in arms:
        group = [arm, reference, oracle] if with_oracle and arm != oracle else [arm, reference]
        questions, aligned = aligned_scores(scores, group)
        if not questions:
            continue
        oracle_scores = aligned[2] if len(aligned) == 3 else (aligned[0] if arm == oracle else None)
        comparisons[arm] = compare_paired(
            aligned[0], aligned[1], oracle_scores, confidence=settings.confidence,
            resamples=settings.resamples(len(questions)),
        )
    return holm_family(comparisons)


def comparisons_frame(comparisons: dict[str, PairedComparison]) -> pl.DataFrame:
    """The comparisons as one row per arm (what the asset writes next to the arm table)."""
    rows = [
        {
            "arm": arm, "n_questions": c.n_questions, "accuracy": c.arm_accuracy,
            "reference_accuracy": c.reference_accuracy,
            "difference": c.difference.value, "difference_low": c.difference.low, "difference_high": c.difference.high,
            "arm_only": c.arm_only, "reference_only": c.reference_only, "mcnemar_p": c.mcnemar_p,
            "p_value": c.p_value, "p_holm": c.p_decisive,
            "headroom_recovered": c.headroom_recovered.value if c.headroom_recovered else None,
            "headroom_recovered_low": c.headroom_recovered.low if c.headroom_recovered else None,
            "headroom_recovered_high": c.headroom_recovered.high if c.headroom_recovered else None,
            "verdict": c.verdict,
        }
        for arm, c in comparisons.items()
    ]
    return pl.DataFrame(rows, infer_schema_length=None)


# ---------------------------------------------------------------------- a conductor's gap in points

# Where a conductor's questions fall, in the order the points are read.
GAP_PARTS = {
    "unparseable": "unparseable workflows",
    "no_solver": "parsed, no worker that solves it alone",
    "solver": "parsed, a worker that solves it alone",
}


def gap_in_points(
    workflows: pl.DataFrame, conductor_arm: str, *, reference: str = REFERENCE_ARM
) -> dict[str, object] | None:
    """The conductor's accuracy gap to `reference`, split over its workflows into parts that add up.

    On the questions both reached, each scored conductor workflow contributes
    (its verdict - the reference's score on the question) / (repeats of the question x questions)
    to the part it falls in: unparseable; parsed but none of its workers solves the question solo
    (majority over the solo arms' repeats); parsed and one of them does. The parts sum to the gap.
    None when the two share no question.
    """
    scores = question_scores(workflows)
    questions, (conductor_scores, reference_scores) = aligned_scores(scores, [conductor_arm, reference])
    if not questions:
        return None
    reference_score = dict(zip(questions, reference_scores.tolist(), strict=True))
    solo = workflows.filter(pl.col("arm").str.starts_with(SoloArm.PREFIX) & pl.col("question_id").is_in(questions))
    solvers = solo_verdicts(
        solo.select("question_id", pl.col("arm").str.strip_prefix(SoloArm.PREFIX).alias("worker"), "correct")
        .iter_rows(named=True)
    )
    rows = workflows.filter(
        (pl.col("arm") == conductor_arm) & pl.col("question_id").is_in(questions)
        & ~pl.col("infra_failure") & pl.col("correct").is_not_null()
    )
    repeats = dict(rows.group_by("question_id").agg(pl.len()).iter_rows())
    parts = dict.fromkeys(GAP_PARTS, 0.0)
    counts = dict.fromkeys(GAP_PARTS, 0)
    for row in rows.iter_rows(named=True):
        qid = row["question_id"]
        if row["parse_code"] != "ok":
            part = "unparseable"
        else:
            solved_by = {w for w, solved in solvers.get(qid, {}).items() if solved}
            part = "solver" if solved_by & set(row["workers"] or []) else "no_solver"
        parts[part] += (float(row["correct"]) - reference_score[qid]) / (repeats[qid] * len(questions))
        counts[part] += 1
    return {
        "arm": conductor_arm,
        "n_questions": len(questions),
        "conductor": float(conductor_scores.mean()),
        "reference": float(reference_scores.mean()),
        "gap": float(conductor_scores.mean() - reference_scores.mean()),
        "parts": parts,
        "workflows": counts,
    }


def conductor_arms(arms: Sequence[str]) -> list[str]:
    return [arm for arm in arms if arm.startswith(ConductorArm.PREFIX)]
