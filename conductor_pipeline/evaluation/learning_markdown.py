"""The evaluation's markdown on whether a conductor learnt to route: each learned arm paired against
the references that tell routing from format and position (its warm start, random routing, its
shuffled-catalogue twin), the agreement cascades, the catalogue positions it picks and whether its
accuracy survives a reordered catalogue. Numbers are rounded as in `markdown`.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from conductor_pipeline.evaluation.markdown import (
    NOT_AVAILABLE,
    VERDICT_RULE,
    fmt_accuracy,
    fmt_estimate_points,
    fmt_p,
    fmt_share,
    github_table,
    markdown_table,
)
from conductor_pipeline.stats import Estimate


def pairs_markdown(frame: pl.DataFrame, labels: Mapping[str, str], kind: str) -> str:
    """A table of `learning.comparison_rows` (each `kind` arm against its references) with the verdict rule."""
    rows = [
        [labels.get(r["arm"], r["arm"]), r["against"], labels.get(r["reference"], r["reference"]), str(r["n_questions"]),
         fmt_accuracy(r["accuracy"]), fmt_accuracy(r["reference_accuracy"]),
         fmt_estimate_points(Estimate(r["difference"], r["difference_low"], r["difference_high"])),
         fmt_p(r["p_holm"]), f"**{r['verdict']}**"]
        for r in frame.iter_rows(named=True)
    ]
    headers = [kind, "against", "reference arm", "questions", f"{kind} accuracy", "reference accuracy",
               "difference (pts) [95% CI]", "p (Holm)", "verdict"]
    return f"{github_table(rows, headers)}\n\n{VERDICT_RULE.format(n=len(rows))}"


def conductor_comparisons_markdown(frame: pl.DataFrame, labels: Mapping[str, str]) -> str:
    """Each conductor arm against the arms that tell routing from format and position."""
    if frame.is_empty():
        return "no conductor arm shares questions with its references"
    return pairs_markdown(frame, labels, "conductor") + (
        " A conductor has learnt to route only if it beats its warm start "
        "and random routing here, and ties with its own pool-order arm when the catalogue is shuffled (`@shuffled`)."
    )


def cascades_markdown(stops: pl.DataFrame, pairs: pl.DataFrame, labels: Mapping[str, str]) -> str:
    """How often each agreement cascade escalated or stopped early (right, wrong), and the cascades
    paired against the vote they stop early and the best single worker."""
    shown = stops.with_columns(pl.col("arm").replace(dict(labels)))
    return markdown_table(shown) + ("\n\n" + pairs_markdown(pairs, labels, "cascade") if pairs.height else "")


def positions_markdown(positions: pl.DataFrame, labels: Mapping[str, str]) -> str:
    """Share of each conductor arm's steps per catalogue position (0 = listed first)."""
    if positions.is_empty():
        return "no parsed conductor workflow recorded its catalogue"
    width = int(positions["position"].max()) + 1
    rows = []
    for arm in positions["arm"].unique(maintain_order=True).to_list():
        shares = dict(positions.filter(pl.col("arm") == arm).select("position", "share").iter_rows())
        steps = int(positions.filter(pl.col("arm") == arm)["steps"].sum())
        rows.append([labels.get(arm, arm), str(steps), *(fmt_share(shares.get(p, 0.0)) for p in range(width))])
    return github_table(rows, ["conductor", "steps", *(f"position {p}" for p in range(width))]) + (
        "\n\nPositions are where the catalogue the conductor saw listed the worker. In pool-file order a position "
        "is also a worker; in a shuffled catalogue a flat row means the policy does not prefer positions."
    )


def order_invariance_markdown(
    agreement: pl.DataFrame, comparisons: pl.DataFrame, labels: Mapping[str, str]
) -> str:
    """Per conductor arm: accuracy with the pool-file order and with a shuffled catalogue, paired,
    and how often the two picked the same workers."""
    if agreement.is_empty():
        return "no conductor arm was evaluated in two catalogue orders"
    rows = []
    for r in agreement.iter_rows(named=True):
        paired = comparisons.filter((pl.col("arm") == r["shuffled_arm"]) & (pl.col("reference") == r["arm"]))
        if paired.height:
            p = paired.row(0, named=True)
            accuracy = f"{fmt_accuracy(p['reference_accuracy'])} / {fmt_accuracy(p['accuracy'])}"
            difference = fmt_estimate_points(Estimate(p["difference"], p["difference_low"], p["difference_high"]))
            verdict = "keeps its accuracy" if p["verdict"] == "ties" else f"**{p['verdict']}** when shuffled"
        else:
            accuracy, difference, verdict = NOT_AVAILABLE, NOT_AVAILABLE, NOT_AVAILABLE
        rows.append([labels.get(r["arm"], r["arm"]), accuracy, difference, str(r["both_parsed"]),
                     fmt_share(r["same_workers"]), fmt_share(r["same_final_worker"]), verdict])
    headers = ["conductor", "accuracy: pool order / shuffled", "shuffled - pool order (pts) [95% CI]",
               "questions both parsed", "same workers", "same final worker", "order invariance"]
    return github_table(rows, headers)
