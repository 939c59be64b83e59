"""Did a conductor learn to route? Its arm against what it started from, random routing and the
vote, where its steps went by worker and by catalogue position, and whether it keeps its choices
when the catalogue lists the same workers in another order.

A conductor that beats the best single worker only by parsing more has learnt the format; one
that prefers low catalogue numbers has learnt a position prior, which looks like routing only for
as long as the pool file lists the good workers first. These tables tell the three apart: every
comparison is paired on the questions both arms reached, with the run's one set of resamples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from conductor_pipeline.evaluation.arms import VoteArm
from conductor_pipeline.evaluation.comparisons import DEFAULT_PAIRED, PairedSettings, aligned_scores, question_scores
from conductor_pipeline.evaluation.routers import BestSingleRouter, RandomRouter, WorldModelRouter
from conductor_pipeline.stats import PairedComparison, compare_paired, holm_family

# The vote every conductor is also held against (the strongest broadcast baseline on the default pool).
VOTE_BASELINE = f"{VoteArm.PREFIX}top5"


def conductor_references(
    arm: str, arms: Sequence[str], started_from: Mapping[str, str], order_twins: Mapping[str, str]
) -> list[tuple[str, str]]:
    """(reference, why) for one conductor arm: the best single worker, random routing, the W-router
    (what a conductor reading W's numbers must not lose to), the warm start it was trained from, the
    vote baseline, and its own pool-order twin when it is a shuffled arm."""
    present = set(arms)
    twins = {shuffled: pool_order for pool_order, shuffled in order_twins.items()}
    candidates = [
        (BestSingleRouter.name, "best single worker"),
        (RandomRouter.name, "random routing"),
        (WorldModelRouter.name, "the W-router"),
        (started_from.get(arm, ""), "its warm start"),
        (VOTE_BASELINE, "vote over the best five"),
        (twins.get(arm, ""), "the same policy, pool-file order"),
    ]
    return [(reference, why) for reference, why in candidates if reference in present and reference != arm]


def compare_pairs(
    workflows: pl.DataFrame, pairs: Sequence[tuple[str, str]], *, settings: PairedSettings = DEFAULT_PAIRED
) -> dict[tuple[str, str], PairedComparison]:
    """(arm, reference) -> the paired comparison on the questions both reached, Holm-adjusted over
    all of `pairs` (one table); pairs sharing no question are left out."""
    scores = question_scores(workflows)
    comparisons = {}
    for arm, reference in pairs:
        questions, (arm_scores, reference_scores) = aligned_scores(scores, [arm, reference])
        if questions:
            comparisons[(arm, reference)] = compare_paired(
                arm_scores, reference_scores, confidence=settings.confidence, resamples=settings.resamples(len(questions))
            )
    return holm_family(comparisons)


def comparison_rows(
    comparisons: Mapping[tuple[str, str], PairedComparison], why: Mapping[tuple[str, str], str]
) -> pl.DataFrame:
    """One row per compared pair, in the order given."""
    return pl.DataFrame(
        [
            {
                "arm": arm, "reference": reference, "against": why.get((arm, reference), ""),
                "n_questions": c.n_questions, "accuracy": c.arm_accuracy, "reference_accuracy": c.reference_accuracy,
                "difference": c.difference.value, "difference_low": c.difference.low,
                "difference_high": c.difference.high, "mcnemar_p": c.mcnemar_p, "p_value": c.p_value,
                "p_holm": c.p_decisive, "verdict": c.verdict,
            }
            for (arm, reference), c in comparisons.items()
        ],
        schema={
            "arm": pl.String, "reference": pl.String, "against": pl.String, "n_questions": pl.Int64,
            "accuracy": pl.Float64, "reference_accuracy": pl.Float64, "difference": pl.Float64,
            "difference_low": pl.Float64, "difference_high": pl.Float64, "mcnemar_p": pl.Float64, "p_value": pl.Float64,
            "p_holm": pl.Float64, "verdict": pl.String,
        },
    )


def conductor_comparisons(
    workflows: pl.DataFrame,
    conductor_arms: Sequence[str],
    *,
    started_from: Mapping[str, str],
    order_twins: Mapping[str, str],
    settings: PairedSettings = DEFAULT_PAIRED,
) -> pl.DataFrame:
    """Every conductor arm against each of its references (`conductor_references`), paired."""
    arms = workflows["arm"].unique().to_list()
    why = {
        (arm, reference): reason
        for arm in conductor_arms
        for reference, reason in conductor_references(arm, arms, started_from, order_twins)
    }
    return comparison_rows(compare_pairs(workflows, list(why), settings=settings), why)


def steps_by_position(workflows: pl.DataFrame) -> pl.DataFrame:
    """Per conductor arm and catalogue position (0 = listed first), its steps and their share, over
    parsed workflows that recorded the catalogue their conductor saw."""
    rows = workflows.filter(
        (pl.col("parse_code") == "ok") & ~pl.col("infra_failure") & pl.col("catalogue").is_not_null()
    ).select("arm", "workers", "catalogue")
    positions = [
        {"arm": row["arm"], "position": list(row["catalogue"]).index(worker)}
        for row in rows.iter_rows(named=True) for worker in row["workers"] or [] if worker in (row["catalogue"] or [])
    ]
    if not positions:
        return pl.DataFrame(schema={"arm": pl.String, "position": pl.Int64, "steps": pl.UInt32, "share": pl.Float64})
    return (
        pl.DataFrame(positions)
        .group_by("arm", "position").agg(pl.len().alias("steps"))
        .with_columns((pl.col("steps") / pl.col("steps").sum().over("arm")).alias("share"))
        .sort("arm", "position")
    )


def order_agreement(workflows: pl.DataFrame, order_twins: Mapping[str, str]) -> pl.DataFrame:
    """Per conductor arm and its shuffled-catalogue twin: on the questions where both parsed, how
    often they sent the question to the same workers (the same sequence of real workers) and to the
    same final worker. A conductor that routes by what the catalogue says picks the same workers
    whatever their order; one with a position prior does not."""
    parsed = workflows.filter((pl.col("parse_code") == "ok") & ~pl.col("infra_failure"))
    rows = []
    for arm, twin in order_twins.items():
        left = parsed.filter(pl.col("arm") == arm).select("question_id", "repeat", pl.col("workers").alias("a"))
        right = parsed.filter(pl.col("arm") == twin).select("question_id", "repeat", pl.col("workers").alias("b"))
        both = left.join(right, on=["question_id", "repeat"])
        same = sum(list(a) == list(b) for a, b in zip(both["a"], both["b"], strict=True))
        same_final = sum(list(a)[-1:] == list(b)[-1:] for a, b in zip(both["a"], both["b"], strict=True))
        n = both.height
        rows.append({
            "arm": arm, "shuffled_arm": twin, "both_parsed": n,
            "same_workers": same / n if n else None, "same_final_worker": same_final / n if n else None,
        })
    return pl.DataFrame(rows, schema={
        "arm": pl.String, "shuffled_arm": pl.String, "both_parsed": pl.Int64,
        "same_workers": pl.Float64, "same_final_worker": pl.Float64,
    })


def choice_balance(rollouts: pl.DataFrame) -> dict[str, object]:
    """How a policy's choices sit against no preference at all: over parsed rollouts (`workers`,
    `catalogue`, `parse_code`), each final worker's catalogue position and identity, counted against
    what uniform picks within each rollout's own catalogue would give (1/k for each of its k entries),
    with a chi-square test of each. A warm start that teaches the format and no routing keeps both near
    uniform; p-values far below 0.05 mean it prefers positions (or workers)."""
    from scipy.stats import chisquare

    parsed = rollouts.filter((pl.col("parse_code") == "ok") & pl.col("catalogue").is_not_null())
    observed_position: dict[int, float] = {}
    expected_position: dict[int, float] = {}
    observed_worker: dict[str, float] = {}
    expected_worker: dict[str, float] = {}
    for row in parsed.iter_rows(named=True):
        catalogue, final = list(row["catalogue"]), row["workers"][-1]
        if final not in catalogue:
            continue
        observed_position[catalogue.index(final)] = observed_position.get(catalogue.index(final), 0) + 1
        observed_worker[final] = observed_worker.get(final, 0) + 1
        for index, worker in enumerate(catalogue):
            expected_position[index] = expected_position.get(index, 0.0) + 1 / len(catalogue)
            expected_worker[worker] = expected_worker.get(worker, 0.0) + 1 / len(catalogue)

    def test(observed: dict, expected: dict) -> dict[str, object]:
        keys = sorted(expected)
        if len(keys) < 2:
            return {"observed": observed, "expected": expected, "p_value": None}
        result = chisquare([observed.get(k, 0) for k in keys], [expected[k] for k in keys])
        return {
            "observed": {str(k): int(observed.get(k, 0)) for k in keys},
            "expected": {str(k): round(expected[k], 1) for k in keys},
            "p_value": float(result.pvalue),
        }

    return {"rollouts": int(sum(observed_position.values())), "by_position": test(observed_position, expected_position),
            "by_worker": test(observed_worker, expected_worker)}
