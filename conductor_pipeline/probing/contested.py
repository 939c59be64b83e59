"""The contested set: the training questions that carry a routing decision.

A question that every worker solves, or none does, gives every rollout the same reward and
so no GRPO gradient. What is left is contested: a weak and a strong worker disagree with
confidence (their pass-rate intervals separate), or the pool's pass rates straddle a band.
Pass rates come from k samples per question x worker, because one sample is a coin flip: a
weak worker's one lucky success makes a question look "too easy" and drops it from the set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import polars as pl

from conductor_pipeline.stats import wilson_interval

# Pass-rate band: a question is contested when some worker is at or below BAND_LOW and some
# worker at or above BAND_HIGH. 0.25/0.75 keeps questions where the pool genuinely splits.
BAND_LOW = 0.25
BAND_HIGH = 0.75


@dataclass(frozen=True)
class ContestedRule:
    """How the contested set is chosen; recorded with the asset so the selection is reproducible."""

    weak: str | None = None  # None: the pool's worst worker by marginal accuracy
    strong: str | None = None  # None: the pool's best worker by marginal accuracy
    band_low: float = BAND_LOW
    band_high: float = BAND_HIGH
    confidence: float = 0.95  # of the Wilson intervals that must separate
    # None: every corpus the pool was probed on. A subset trains where the routing decision is made:
    # on easy corpora a group of good workflows is often right in every rollout.
    corpora: tuple[str, ...] | None = None

    def as_dict(self) -> dict[str, object]:
        described = asdict(self)
        if self.corpora is not None:
            described["corpora"] = list(self.corpora)
        return described


@dataclass
class ContestedSelection:
    questions: pl.DataFrame  # one row per contested question, with why it was kept
    weak: str
    strong: str
    counts: dict[str, int] = field(default_factory=dict)
    # question classes with one sample per worker vs with all k; None when every cell has one sample
    one_sample_flips: dict[str, int] | None = None

    @property
    def question_ids(self) -> list[str]:
        return self.questions["question_id"].to_list()


def marginal_accuracy(pass_rates: pl.DataFrame) -> pl.DataFrame:
    """Per worker: successes / samples over every question, best first (ties: smallest name)."""
    return (
        pass_rates.group_by("worker")
        .agg(pl.col("successes").sum(), pl.col("samples").sum())
        .with_columns(accuracy=pl.col("successes") / pl.col("samples"))
        .sort(["accuracy", "worker"], descending=[True, False])
    )


def classify(pass_rates: pl.DataFrame) -> pl.DataFrame:
    """Per question: min and max worker pass rate and whether all / none of the pool solves it."""
    return pass_rates.group_by("question_id").agg(
        min_rate=pl.col("pass_rate").min(),
        max_rate=pl.col("pass_rate").max(),
        workers=pl.len(),
    ).with_columns(
        cls=pl.when(pl.col("min_rate") >= 1.0)
        .then(pl.lit("all_solve"))
        .when(pl.col("max_rate") <= 0.0)
        .then(pl.lit("none_solve"))
        .otherwise(pl.lit("mixed"))
    )


def select_contested(
    pass_rates: pl.DataFrame,
    rule: ContestedRule = ContestedRule(),
    *,
    first_samples: pl.DataFrame | None = None,
) -> ContestedSelection:
    """Choose the contested questions from per question x worker pass rates.

    `pass_rates` has question_id, worker, samples, successes (pass_rate is derived from them).
    `first_samples` (question_id, worker, correct: each cell's lowest sample index) lets the
    result say how many questions a one-sample probe would have classified differently.
    Only questions every worker has a pass rate for are considered.
    """
    if pass_rates.is_empty():
        raise ValueError("no pass rates: probe the pool before choosing a contested set")
    rates = pass_rates.with_columns(pass_rate=pl.col("successes") / pl.col("samples"))
    n_workers = rates["worker"].n_unique()
    covered = rates.group_by("question_id").agg(n=pl.len()).filter(pl.col("n") == n_workers)
    rates = rates.join(covered.select("question_id"), on="question_id")

    ranking = marginal_accuracy(rates)["worker"].to_list()
    strong = rule.strong or ranking[0]
    weak = rule.weak or ranking[-1]
    for name in (weak, strong):
        if name not in ranking:
            raise ValueError(f"contested rule names worker {name!r}, not in the pass rates: {ranking}")

    lo, hi = wilson_interval(rates["successes"].to_numpy(), rates["samples"].to_numpy(), rule.confidence)
    rates = rates.with_columns(ci_low=pl.Series(lo), ci_high=pl.Series(hi))
    pair = (
        rates.filter(pl.col("worker") == weak)
        .select("question_id", weak_rate="pass_rate", weak_low="ci_low", weak_high="ci_high")
        .join(
            rates.filter(pl.col("worker") == strong).select(
                "question_id", strong_rate="pass_rate", strong_low="ci_low", strong_high="ci_high"
            ),
            on="question_id",
        )
    )
    per_question = classify(rates).join(pair, on="question_id").with_columns(
        separated=(pl.col("strong_low") > pl.col("weak_high")) | (pl.col("weak_low") > pl.col("strong_high")),
        in_band=(pl.col("min_rate") <= rule.band_low) & (pl.col("max_rate") >= rule.band_high),
    )
    contested = (
        per_question.filter((pl.col("cls") == "mixed") & (pl.col("separated") | pl.col("in_band")))
        .with_columns(
            reason=pl.when(pl.col("separated") & pl.col("in_band"))
            .then(pl.lit("separated+band"))
            .when(pl.col("separated"))
            .then(pl.lit("separated"))
            .otherwise(pl.lit("band"))
        )
        .select("question_id", "reason", "min_rate", "max_rate", "weak_rate", "strong_rate")
        .sort("question_id")
    )
    counts = {
        "candidates": per_question.height,
        "all_solve": int((per_question["cls"] == "all_solve").sum()),
        "none_solve": int((per_question["cls"] == "none_solve").sum()),
        "mixed_not_contested": per_question.filter(pl.col("cls") == "mixed").height - contested.height,
        "separated": int(contested["reason"].str.contains("separated").sum()),
        "band_only": int((contested["reason"] == "band").sum()),
        "contested": contested.height,
    }
    flips = None
    if first_samples is not None and int(rates["samples"].max()) > 1:
        flips = one_sample_flips(per_question, first_samples)
    return ContestedSelection(contested, weak=weak, strong=strong, counts=counts, one_sample_flips=flips)


def one_sample_flips(per_question: pl.DataFrame, first_samples: pl.DataFrame) -> dict[str, int]:
    """How a one-sample probe would have classified the questions that k samples classify.

    Keys are `<one-sample class>-><k-sample class>`; the off-diagonal ones are the flips,
    e.g. `all_solve->mixed` counts questions a single probe would have dropped as too easy.
    """
    single = classify(
        first_samples.with_columns(samples=pl.lit(1), successes=pl.col("correct").cast(pl.Int64)).with_columns(
            pass_rate=pl.col("successes").cast(pl.Float64)
        )
    ).select("question_id", one_sample="cls")
    joined = per_question.select("question_id", k_samples="cls").join(single, on="question_id")
    table = joined.group_by("one_sample", "k_samples").len()
    out = {f"{r['one_sample']}->{r['k_samples']}": int(r["len"]) for r in table.iter_rows(named=True)}
    out["flipped"] = int(joined.filter(pl.col("one_sample") != pl.col("k_samples")).height)
    out["one_sample_too_easy"] = int((joined["one_sample"] == "all_solve").sum())
    out["one_sample_too_easy_but_mixed"] = int(
        joined.filter((pl.col("one_sample") == "all_solve") & (pl.col("k_samples") == "mixed")).height
    )
    return out


def pass_rate_histogram(pass_rates: pl.DataFrame, bins: int = 5) -> pl.DataFrame:
    """Questions per band of pool-mean pass rate: where the pool's difficulty mass sits."""
    means = pass_rates.group_by("question_id").agg(mean=(pl.col("successes") / pl.col("samples")).mean())
    edges = np.linspace(0, 1, bins + 1)
    labels = [f"[{edges[i]:.1f}, {edges[i + 1]:.1f}{']' if i == bins - 1 else ')'}" for i in range(bins)]
    index = np.minimum((means["mean"].to_numpy() * bins).astype(int), bins - 1)
    counts = np.bincount(index, minlength=bins)
    return pl.DataFrame({"pool_mean_pass_rate": labels, "questions": counts.tolist()})


def routing_anchors(pass_rates: pl.DataFrame) -> dict[str, tuple[list[str], list[str]]]:
    """Per question whose workers differ: (its best workers, its worst workers) by pass rate.

    Why: a randomised sub-pool that happens to show only solvers (or only failers) of a contested
    question removes the routing decision the question was chosen for, and every rollout of it
    scores the same. Showing one worker of each list keeps the decision in every sub-pool
    (`conductor_pipeline.training.rollouts.conductor_prompt_rows(must_show=...)`).
    """
    rates = pass_rates
    if "pass_rate" not in rates.columns:
        rates = rates.with_columns(pass_rate=pl.col("successes") / pl.col("samples"))
    extremes = rates.group_by("question_id").agg(
        best=pl.col("worker").filter(pl.col("pass_rate") == pl.col("pass_rate").max()).sort(),
        worst=pl.col("worker").filter(pl.col("pass_rate") == pl.col("pass_rate").min()).sort(),
        spread=pl.col("pass_rate").max() - pl.col("pass_rate").min(),
    )
    return {
        qid: (list(best), list(worst))
        for qid, best, worst, spread in extremes.iter_rows()
        if spread > 0
    }
