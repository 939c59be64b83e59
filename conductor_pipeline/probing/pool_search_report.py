"""The pool search's report as a reader takes it in: one verdict line per pool, the search table with
what its columns mean, and per searched pool which member wins each subject."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
from tabulate import tabulate

from conductor_pipeline.probing.pool_search import ALL_CANDIDATES, PoolSearchReport

MISSING = "-"


def verdict_lines(report: PoolSearchReport) -> list[str]:
    """One line per searched pool and per reference pool: its headroom on train and on eval, and
    whether the eval interval is clear of 0; then the largest headroom found out of sample."""
    lines = [
        f"searched sub-pools of {report.settings.min_size}-{report.settings.max_size} among {len(report.candidates)} "
        f"workers on {report.n_train} train-split questions (beam width {report.settings.beam_width}); "
        f"re-measured on {report.n_eval} eval-split questions"
    ]
    for r in report.searched:
        low, high = r.eval_headroom_interval
        held = "holds: interval above 0" if r.holds_out_of_sample else "does NOT clearly hold: interval reaches 0"
        lines.append(
            f"size {r.size}: {', '.join(r.members)}: headroom {r.train.headroom:+.3f} on train -> "
            f"{r.eval.headroom:+.3f} [{low:+.3f}, {high:+.3f}] on eval ({held}); eval oracle {r.eval.oracle:.3f} "
            f"vs best member {r.eval.best_worker} {r.eval.best_single:.3f}; error correlation "
            f"{r.error_correlation:+.2f}"
        )
    for r in (r for r in report.results if r.kind == "reference"):
        low, high = r.eval_headroom_interval
        lines.append(
            f"{r.label} (not searched): headroom {r.train.headroom:+.3f} on train, {r.eval.headroom:+.3f} "
            f"[{low:+.3f}, {high:+.3f}] on eval; eval oracle {r.eval.oracle:.3f} vs best member "
            f"{r.eval.best_worker} {r.eval.best_single:.3f}"
        )
    best = report.best_out_of_sample
    if best is not None:
        lines.append(
            f"largest headroom out of sample: size {best.size} ({', '.join(best.members)}), "
            f"{best.eval.headroom:+.3f} over {best.eval.best_worker} at oracle {best.eval.oracle:.3f}"
        )
        strongest = report.strongest_candidate
        if strongest is not None and strongest[1] > best.eval.oracle:
            lines.append(
                f"for scale: {strongest[0]} alone scores {strongest[1]:.3f} on eval, above that pool's oracle: "
                "its headroom is real but routing within it cannot match the strongest worker"
            )
    return lines


def search_table_markdown(report: PoolSearchReport) -> str:
    """The search table, what its columns mean, and the sampling-luck caveat."""
    estimated = " (est.)" if report.tokens_estimated else ""
    headers = [
        "pool", "size", "train headroom", "eval headroom [95% CI]", "eval oracle", "eval best single",
        "null-pool headroom", "error corr.", f"USD/question, all members{estimated}",
        f"USD/question, best single{estimated}", "workers",
    ]
    rows = []
    for r in report.results:
        low, high = r.eval_headroom_interval
        null = MISSING if r.null_headroom is None else f"{r.null_headroom:+.3f} ({r.null_samples} samples)"
        rows.append([
            r.label, str(r.size), f"{r.train.headroom:+.3f}", f"{r.eval.headroom:+.3f} [{low:+.3f}, {high:+.3f}]",
            f"{r.eval.oracle:.3f}", f"{r.eval.best_single:.3f} ({r.eval.best_worker})", null,
            f"{r.error_correlation:+.2f}", _usd(r.cost_all_members), _usd(r.cost_best_single),
            "every candidate" if r.label.startswith(ALL_CANDIDATES) else ", ".join(r.members),
        ])
    lines = [
        tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True),
        "",
        f"Population: {report.population}; {report.n_train} on the train side of the project's split (searched), "
        f"{report.n_eval} on the eval side (re-measured). Headroom = oracle - the pool's own best single worker, "
        "re-chosen on each split and each bootstrap resample. Error corr.: mean pairwise correlation of the "
        "members' right/wrong outcomes on train (near 1: correlated generalists; near 0 or below: asymmetric). "
        "Cost: mean per eval question, from list prices"
        + (" and token counts estimated from characters (replay has no usage block)." if report.tokens_estimated
           else "."),
        "",
        *report.notes,
    ]
    if report.excluded:
        shown = ", ".join(f"{w} ({share:.0%})" for w, share in sorted(report.excluded.items()))
        lines += ["", f"Not candidates (answered too few of the population's questions): {shown}."]
    return "\n".join(lines).rstrip() + "\n"


def subject_tables_markdown(report: PoolSearchReport) -> str:
    """Per searched pool: each member's eval accuracy per subject, the winner in bold."""
    parts = []
    for r in report.searched:
        parts += [f"**{r.label}** ({', '.join(r.members)}): {_winner_summary(r.subject_table, r.members)}", ""]
        parts += [subject_table_markdown(r.subject_table, r.members), ""]
    return "\n".join(parts)


def report_markdown(report: PoolSearchReport) -> str:
    """The whole report as one markdown file: verdict lines, the search table, who wins where."""
    return (
        "# Pool search\n\n" + verdict_markdown(report) + "\n\n" + search_table_markdown(report)
        + "\n## Who wins where (eval split)\n\n" + subject_tables_markdown(report)
    )


def verdict_markdown(report: PoolSearchReport) -> str:
    """The verdict lines as a markdown list."""
    return "\n".join(f"- {line}" for line in verdict_lines(report))


def _usd(value: float | None) -> str:
    return MISSING if value is None or np.isnan(value) else f"{value:.5f}"


def subject_winners(table: pl.DataFrame, members: Sequence[str]) -> list[list[str]]:
    """Per row of a subject table, the member(s) with the highest accuracy."""
    winners = []
    for row in table.iter_rows(named=True):
        top = max(row[m] for m in members)
        winners.append([m for m in sorted(members) if np.isclose(row[m], top)])
    return winners


def subject_table_markdown(table: pl.DataFrame, members: Sequence[str]) -> str:
    names = sorted(members)
    rows = []
    for row, winners in zip(table.iter_rows(named=True), subject_winners(table, names), strict=True):
        cells = [f"**{row[m]:.3f}**" if m in winners else f"{row[m]:.3f}" for m in names]
        rows.append([row["subject"], str(row["questions"]), *cells, f"{row['oracle']:.3f}", " = ".join(winners)])
    headers = ["subject", "questions", *names, "pool oracle", "winner"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _winner_summary(table: pl.DataFrame, members: Sequence[str]) -> str:
    sole = [w[0] for w in subject_winners(table, sorted(members)) if len(w) == 1]
    distinct = sorted(set(sole))
    if len(distinct) <= 1:
        who = distinct[0] if distinct else "no member"
        return f"{who} wins every subject it does not tie: a generalist pool on these subjects."
    counts = ", ".join(f"{w} {sole.count(w)}" for w in distinct)
    return f"{len(distinct)} different members win a subject outright ({counts} of {table.height} subjects)."
