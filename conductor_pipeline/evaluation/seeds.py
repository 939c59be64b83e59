"""Verdicts over seeds: a recipe's trained arms against their references, pooled over seed runs.

One seed's verdict is a statement about one conductor; a verdict about a *recipe* has to hold over
the seeds (and the machines) it is trained with. Each seed run is evaluated on the same eval slice,
so every (seed, question) cell has a paired difference `arm - reference`. The pooled estimate is the
mean over seeds and questions; its interval comes from a two-way ("pigeonhole") bootstrap that
resamples seeds and questions independently and keeps the cells where they cross (Owen 2007, *The
pigeonhole bootstrap*, Ann. Appl. Stat. 1(2)). Seeds and questions are crossed, not nested: a seed
that trained a good conductor is good on most questions, and only resampling whole seeds carries
that into the interval. (rliable's stratified bootstrap resamples the runs of each task on their
own, which averages such a seed away; and its pinned `arch<8` does not import under pandas 3.)

One test decides every verdict: the bootstrap's two-sided p-value of "no difference", adjusted with
Holm's step-down correction over every comparison of the table (they share references), against
`alpha`. The 95% interval is shown beside it, unadjusted; each seed's own verdict too, by the same
test on that seed's questions alone (a paired bootstrap over questions, Holm over the same pairs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from conductor_pipeline.evaluation.comparisons import aligned_scores
from conductor_pipeline.evaluation.markdown import fmt_p
from conductor_pipeline.stats import (
    DEFAULT_CONFIDENCE,
    Estimate,
    Verdict,
    bootstrap_p_value,
    compare_paired,
    holm_adjusted,
    holm_family,
    per_question_scores,
    percentile_interval,
    question_resample_counts,
    verdict_of,
)

# Two-way resamples of a pooled comparison: the p-value's resolution is 2 / resamples.
DEFAULT_SEED_RESAMPLES = 10_000
DEFAULT_ALPHA = 1 - DEFAULT_CONFIDENCE
POOLED_TEST = "two-way bootstrap over seeds and questions, Holm-adjusted over the table"


@dataclass(frozen=True)
class SeedScores:
    """One seed run's per-question scores: `scores` is (arm, question_id, score), as
    `comparisons.question_scores` builds it from the run's eval workflows."""

    seed: int
    scores: pl.DataFrame

    @property
    def arms(self) -> set[str]:
        return set(self.scores["arm"].unique().to_list())


@dataclass(frozen=True)
class PooledComparison:
    """`arm` against `reference` over the seeds that evaluated both, on the questions all of them share."""

    arm: str
    reference: str
    seeds: tuple[int, ...]
    n_questions: int
    arm_accuracy: float
    reference_accuracy: float
    difference: Estimate
    p_value: float
    p_holm: float
    verdict: Verdict
    # Each seed's own paired difference (bootstrap over questions) and its verdict, by seed.
    per_seed: Mapping[int, Estimate]
    per_seed_verdict: Mapping[int, Verdict]


def two_way_bootstrap(
    differences: np.ndarray, *, n_resamples: int = DEFAULT_SEED_RESAMPLES, seed: int = 0
) -> np.ndarray:
    """The mean of a (seeds x questions) matrix under `n_resamples` draws that resample its rows and
    its columns independently, with replacement: a cell counts once per (drawn seed, drawn question)."""
    n_seeds, n_questions = differences.shape
    if n_seeds == 0 or n_questions == 0:
        raise ValueError("a pooled comparison needs at least one seed and one question")
    seed_counts = question_resample_counts(n_seeds, n_resamples, seed)
    question_counts = question_resample_counts(n_questions, n_resamples, seed + 1)
    weighted = seed_counts @ differences  # (resamples, questions): each drawn seed's row, summed
    return np.einsum("rq,rq->r", weighted, question_counts) / (n_seeds * n_questions)


def pooled_comparisons(
    runs: Sequence[SeedScores],
    pairs: Sequence[tuple[str, str]],
    *,
    alpha: float = DEFAULT_ALPHA,
    n_resamples: int = DEFAULT_SEED_RESAMPLES,
    bootstrap_seed: int = 0,
) -> list[PooledComparison]:
    """Each (arm, reference) pair pooled over the seed runs that evaluated both, paired per seed and
    question on the questions every such run shares; Holm's correction runs over all of `pairs`.
    A pair no run evaluated is left out (the caller says which seeds lacked an arm)."""
    pooled: list[tuple[str, str, list[int], list[str], np.ndarray, np.ndarray]] = []
    for arm, reference in pairs:
        covering = [run for run in runs if {arm, reference} <= run.arms]
        if not covering:
            continue
        aligned = [aligned_scores(run.scores, [arm, reference]) for run in covering]
        shared = set.intersection(*(set(questions) for questions, _ in aligned))
        if not shared:
            continue
        ordered = sorted(shared)
        arm_rows, reference_rows = [], []
        for questions, (arm_scores, reference_scores) in aligned:
            index = {question: i for i, question in enumerate(questions)}
            keep = [index[question] for question in ordered]
            arm_rows.append(per_question_scores(arm_scores[keep]))
            reference_rows.append(per_question_scores(reference_scores[keep]))
        pooled.append((arm, reference, [run.seed for run in covering], ordered, np.vstack(arm_rows),
                       np.vstack(reference_rows)))

    draws = [two_way_bootstrap(a - r, n_resamples=n_resamples, seed=bootstrap_seed) for *_, a, r in pooled]
    p_values = [bootstrap_p_value(d) for d in draws]
    adjusted = holm_adjusted(p_values)
    # Each seed alone: the same pairs, paired over its questions, Holm-adjusted over the pairs it has.
    all_seeds = sorted({seed for _arm, _reference, seeds, *_ in pooled for seed in seeds})
    per_seed = {
        seed: holm_family({
            index: compare_paired(a[seeds.index(seed)], r[seeds.index(seed)], confidence=1 - alpha, seed=bootstrap_seed)
            for index, (_arm, _reference, seeds, _questions, a, r) in enumerate(pooled) if seed in seeds
        })
        for seed in all_seeds
    }
    results = []
    for index, ((arm, reference, seeds, questions, a, r), d, p, p_holm) in enumerate(
        zip(pooled, draws, p_values, adjusted, strict=True)
    ):
        low, high = percentile_interval(d, 1 - alpha)
        difference = float((a - r).mean())
        results.append(PooledComparison(
            arm=arm, reference=reference, seeds=tuple(seeds), n_questions=len(questions),
            arm_accuracy=float(a.mean()), reference_accuracy=float(r.mean()),
            difference=Estimate(difference, low, high), p_value=p, p_holm=p_holm,
            verdict=verdict_of(difference, p_holm, alpha),
            per_seed={seed: per_seed[seed][index].difference for seed in seeds},
            per_seed_verdict={seed: per_seed[seed][index].verdict for seed in seeds},
        ))
    return results


def pooled_frame(comparisons: Sequence[PooledComparison]) -> pl.DataFrame:
    """One row per pooled comparison, with each seed's difference and verdict as lists in seed order."""
    schema = {
        "arm": pl.String, "reference": pl.String, "seeds": pl.List(pl.Int64), "n_questions": pl.Int64,
        "accuracy": pl.Float64, "reference_accuracy": pl.Float64, "difference": pl.Float64,
        "difference_low": pl.Float64, "difference_high": pl.Float64, "p_value": pl.Float64, "p_holm": pl.Float64,
        "verdict": pl.String, "per_seed_difference": pl.List(pl.Float64), "per_seed_verdict": pl.List(pl.String),
    }
    return pl.DataFrame(
        [
            {
                "arm": c.arm, "reference": c.reference, "seeds": list(c.seeds), "n_questions": c.n_questions,
                "accuracy": c.arm_accuracy, "reference_accuracy": c.reference_accuracy,
                "difference": c.difference.value, "difference_low": c.difference.low,
                "difference_high": c.difference.high, "p_value": c.p_value, "p_holm": c.p_holm, "verdict": c.verdict,
                "per_seed_difference": [c.per_seed[s].value for s in c.seeds],
                "per_seed_verdict": [c.per_seed_verdict[s] for s in c.seeds],
            }
            for c in comparisons
        ],
        schema=schema,
    )


def accuracy_spread(per_seed_accuracy: Mapping[int, float]) -> dict[str, float]:
    """Mean, min and max of an arm's accuracy over seeds: the range a new seed or machine should land in."""
    values = np.asarray(list(per_seed_accuracy.values()), dtype=float)
    if values.size == 0:
        raise ValueError("no seed evaluated this arm")
    return {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max()),
            "std": float(values.std(ddof=1)) if values.size > 1 else 0.0}


def pooled_pairs(seed_pairs: Sequence[Sequence[tuple[str, str]]], trained: Sequence[str]) -> list[tuple[str, str]]:
    """The comparisons a recipe's verdicts rest on, from each seed's conductor pairs: every trained
    arm against its references, and a reordered trained arm against its pool-order twin (order
    invariance); in first-seen order, each once."""
    chosen: dict[tuple[str, str], None] = {}
    for pairs in seed_pairs:
        for arm, reference in pairs:
            if arm in trained or (arm.partition("@")[0] in trained and reference == arm.partition("@")[0]):
                chosen[(arm, reference)] = None
    return list(chosen)


def pooled_markdown(comparisons: Sequence[PooledComparison]) -> str:
    """The pooled verdicts as a table, with the test that decides them and each seed's own verdict."""
    if not comparisons:
        return "No trained arm was evaluated by any seed run."
    rows = [
        "| arm | against | pooled difference (pts, unadjusted 95% CI) | p (Holm) | verdict | per seed |",
        "|---|---|---|---:|---|---|",
    ]
    for c in comparisons:
        per_seed = ", ".join(f"{seed}: {100 * c.per_seed[seed].value:+.1f} {c.per_seed_verdict[seed]}" for seed in c.seeds)
        interval = f"{100 * c.difference.value:+.1f} [{100 * c.difference.low:+.1f}, {100 * c.difference.high:+.1f}]"
        rows.append(f"| `{c.arm}` | `{c.reference}` | {interval} | {fmt_p(c.p_holm)} | {c.verdict} | {per_seed} |")
    seeds = sorted({seed for c in comparisons for seed in c.seeds})
    rows += ["", f"Pooled over seeds {', '.join(map(str, seeds))} on {comparisons[0].n_questions} shared questions. "
             f"Verdict: {POOLED_TEST} ({len(comparisons)} comparisons), at {1 - DEFAULT_ALPHA:.0%}; per seed: a paired "
             "bootstrap over that seed's questions, Holm-adjusted over the same comparisons."]
    return "\n".join(rows)

