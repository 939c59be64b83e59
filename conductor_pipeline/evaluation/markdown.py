"""The evaluation's markdown: the arm table, the paired verdicts, the conductor's result, the cost
story and the routing summary, in the form a reader takes in at a glance (whether a conductor learnt to
route: `learning_markdown`).

Numbers are rounded one way everywhere: accuracies to 3 decimals, differences in accuracy points
with one decimal and a sign, costs to 3 significant digits (never a bare 0.000), p-values to 3
decimals or "<0.001"; a value that does not exist reads "n/a", never a blank cell.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import polars as pl
from tabulate import tabulate

from conductor_pipeline.evaluation.arms import VoteArm
from conductor_pipeline.evaluation.cascades import CascadeArm
from conductor_pipeline.evaluation.comparisons import GAP_PARTS, REFERENCE_ARM
from conductor_pipeline.stats import Estimate, PairedComparison

NOT_AVAILABLE = "n/a"
ESTIMATED_NOTE = (
    "est. = estimated: replay records no token usage, so tokens are characters / 4 and costs are "
    "those tokens at the seat's list prices"
)
# The one test behind every verdict of a table (stats.PairedComparison.verdict), said once.
VERDICT_RULE = (
    "Verdict: beats / loses when the paired bootstrap's two-sided p-value, Holm-adjusted over the table's {n} "
    "comparisons, is under 0.05 and the difference is above / below 0; else ties."
)
# How each population is drawn, for the routing summary.
REPORT_POPULATION = "held-out questions of a cross-validation over every scored question, all corpora and splits"
CEILING_POPULATION = "every probed question, all corpora and splits; majority of probe samples"


# ---------------------------------------------------------------------- numbers


def fmt_accuracy(value: float | None) -> str:
    return NOT_AVAILABLE if _missing(value) else f"{value:.3f}"


def fmt_points(value: float | None) -> str:
    """An accuracy difference in points (0.052 -> +5.2)."""
    return NOT_AVAILABLE if _missing(value) else f"{100 * value:+.1f}"


def fmt_estimate_points(estimate: Estimate) -> str:
    """`+5.2 [+2.1, +8.4]` (points)."""
    return f"{fmt_points(estimate.value)} [{fmt_points(estimate.low)}, {fmt_points(estimate.high)}]"


def fmt_share_estimate(estimate: Estimate | None) -> str:
    """APGR as `+6.5% [-20.1%, +31.0%]`."""
    if estimate is None:
        return NOT_AVAILABLE
    return f"{_pct(estimate.value)} [{_pct(estimate.low)}, {_pct(estimate.high)}]"


def fmt_cost(value: float | None) -> str:
    """USD to 3 significant digits without an exponent: 0.00412, 1.57, 0 (exactly nothing)."""
    if _missing(value):
        return NOT_AVAILABLE
    if value == 0:
        return "0"
    decimals = max(2, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def fmt_p(value: float) -> str:
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def fmt_number(value: float | None, digits: int = 0) -> str:
    return NOT_AVAILABLE if _missing(value) else f"{value:,.{digits}f}"


def _pct(value: float) -> str:
    return NOT_AVAILABLE if _missing(value) else f"{100 * value:+.1f}%"


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# ---------------------------------------------------------------------- labels


def arm_labels(arms: Sequence[str], *, best_single_worker: str | None, replayed: bool) -> dict[str, str]:
    """What the tables call each arm: the best single arm names its worker, and on replay the vote
    and cascade arms say they are computed from recordings."""
    labels = {}
    for arm in arms:
        label = arm
        if arm == REFERENCE_ARM and best_single_worker:
            label = f"{arm} ({best_single_worker})"
        elif replayed and arm.startswith((VoteArm.PREFIX, CascadeArm.PREFIX)):
            label = f"{arm} (from recordings)"
        labels[arm] = label
    return labels


# ---------------------------------------------------------------------- tables


def markdown_table(frame: pl.DataFrame, *, float_digits: int = 3) -> str:
    """A small frame as a GitHub markdown table (what Dagster's UI renders in metadata)."""
    rows = [[", ".join(map(str, v)) if isinstance(v, list) else v for v in row] for row in frame.iter_rows()]
    return tabulate(
        rows, headers=frame.columns, tablefmt="github", floatfmt=f".{float_digits}f", missingval=NOT_AVAILABLE
    )


def github_table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    """Pre-formatted cells as a GitHub table (tabulate would re-parse numeric strings)."""
    return tabulate(rows, headers=list(headers), tablefmt="github", disable_numparse=True)


def arm_table_markdown(table: pl.DataFrame, labels: Mapping[str, str] | None = None) -> str:
    """The arm table under reader headers, workers then baselines then conductors (the frame's order).

    `n` is shown per row only when it differs between arms (else once, as the run's `n_label`);
    token counts and costs say whether they were reported or estimated.
    """
    labels = labels or {}
    per_row_n = table.height > 0 and table["n_label"].n_unique() > 1
    headers = ["arm", "kind", *(["n"] if per_row_n else []), "repeats", "accuracy", "95% CI", "SE",
               "cost / question (USD)", "tokens / question", "tokens & cost", "latency / question (s)",
               "steps / workflow", "parsed share"]
    rows = []
    for r in table.iter_rows(named=True):
        rows.append([
            labels.get(r["arm"], r["arm"]), r["kind"], *([r["n_label"]] if per_row_n else []), str(r["repeats"]),
            fmt_accuracy(r["accuracy"]), f"[{fmt_accuracy(r['ci_low'])}, {fmt_accuracy(r['ci_high'])}]",
            r["se_note"] or fmt_accuracy(r["se"]), fmt_cost(r["cost_per_question"]),
            fmt_number(r["tokens_per_question"]),
            NOT_AVAILABLE if r["tokens_estimated"] is None else ("est." if r["tokens_estimated"] else "reported"),
            fmt_number(r["latency_per_question_s"], 2), fmt_number(r["mean_steps"], 2), fmt_share(r["parse_ok_share"]),
        ])
    text = github_table(rows, headers)
    if table.height and table["tokens_estimated"].fill_null(False).any():
        text += f"\n\n{ESTIMATED_NOTE}."
    return text


def paired_table_markdown(
    comparisons: Mapping[str, PairedComparison], order: Sequence[str], labels: Mapping[str, str]
) -> str:
    """Every arm against the best single worker on the questions both reached."""
    headers = ["arm", "questions", "accuracy", "best single", "difference (pts) [95% CI]", "arm right, best wrong",
               "best right, arm wrong", "p (Holm)", "oracle headroom recovered [95% CI]", "verdict"]
    rows = [
        [labels.get(arm, arm), str(c.n_questions), fmt_accuracy(c.arm_accuracy), fmt_accuracy(c.reference_accuracy),
         fmt_estimate_points(c.difference), str(c.arm_only), str(c.reference_only), fmt_p(c.p_decisive),
         fmt_share_estimate(c.headroom_recovered), c.verdict]
        for arm in order if (c := comparisons.get(arm)) is not None
    ]
    return github_table(rows, headers) + (
        "\n\nDifference: arm minus best single, percentile bootstrap over questions (a question's repeats "
        "resampled together). Headroom recovered (APGR): (arm - best single) / (oracle - best single). "
        f"{VERDICT_RULE.format(n=len(rows))} The exact McNemar test of the discordant counts is in the table's "
        "parquet (`mcnemar_p`), not a verdict."
    )


# ---------------------------------------------------------------------- verdicts


def verdict_lines(
    comparisons: Mapping[str, PairedComparison],
    order: Sequence[str],
    labels: Mapping[str, str],
    *,
    reference_label: str,
    max_chars: int | None = None,
) -> str:
    """One line per arm: beats / ties / loses the best single worker, by the paired interval.

    With `max_chars` (the UI shows shorter markdown inline), the lines drop the p-value, then the
    interval, then collapse to one line per verdict, until they fit; the paired table keeps the detail.
    """
    shown = [arm for arm in order if arm in comparisons]
    if not shown:
        return "no arm shares questions with the best single worker"
    first = next(iter(comparisons.values()))
    head = (f"Against {reference_label}, {fmt_accuracy(first.reference_accuracy)}, on the same questions "
            f"(paired bootstrap, Holm-adjusted over {len(comparisons)} arms):")

    def full(arm: str) -> str:
        c = comparisons[arm]
        return (f"- {labels.get(arm, arm)}: **{c.verdict}** {fmt_estimate_points(c.difference)} pts, "
                f"p {fmt_p(c.p_decisive)}")

    def interval(arm: str) -> str:
        c = comparisons[arm]
        return f"- {labels.get(arm, arm)}: **{c.verdict}** {fmt_estimate_points(c.difference)} pts"

    def short(arm: str) -> str:
        c = comparisons[arm]
        return f"- {labels.get(arm, arm)}: **{c.verdict}** {fmt_points(c.difference.value)} pts"

    def grouped() -> list[str]:
        lines = []
        for verdict in ("beats", "ties", "loses"):
            arms = [labels.get(a, a) for a in shown if comparisons[a].verdict == verdict]
            lines.append(f"- **{verdict}**: {', '.join(arms) if arms else 'none'}")
        return lines

    for lines in ([full(a) for a in shown], [interval(a) for a in shown], [short(a) for a in shown], grouped()):
        text = "\n".join([head, *lines])
        if max_chars is None or len(text) < max_chars:
            return text
    return text


def conductor_summary(
    comparisons: Mapping[str, PairedComparison],
    conductors: Sequence[str],
    points: Mapping[str, Mapping[str, object]],
    *,
    reference_label: str,
    max_chars: int | None = None,
) -> str:
    """Each conductor against the best single worker, and its gap as accuracy points that add up.

    With `max_chars` (the UI shows shorter markdown inline), the lines drop the gap's parts (the
    decomposition table has them), then the question counts and p-value, then the interval, until
    they fit; the verdict of every conductor arm stays."""
    if not conductors:
        return "no conductor arm in this run"

    def line(arm: str, detail: int) -> str:
        c = comparisons.get(arm)
        if c is None:
            return f"- **{arm}**: shares no scored question with {reference_label}"
        if detail == 0:
            return f"- **{arm}**: **{c.verdict}** {fmt_points(c.difference.value)} pts"
        text = (f"- **{arm}** {fmt_accuracy(c.arm_accuracy)} vs {reference_label} {fmt_accuracy(c.reference_accuracy)}"
                f": **{c.verdict}**, {fmt_estimate_points(c.difference)} pts")
        if detail == 1:
            return text + "."
        text += (f", p (Holm) {fmt_p(c.p_decisive)} on {c.n_questions} questions ({c.arm_only} questions only it "
                 f"solved, {c.reference_only} only best single solved).")
        split = points.get(arm)
        if detail == 3 and split is not None:
            terms = " ".join(f"{fmt_points(v)} ({GAP_PARTS[k]})" for k, v in split["parts"].items())
            text += f" Gap in points: {terms} = {fmt_points(split['gap'])}."
        return text

    for detail in (3, 2, 1):
        text = "\n".join(line(arm, detail) for arm in conductors)
        if max_chars is None or len(text) <= max_chars:
            return text
    return "\n".join(line(arm, 0) for arm in conductors)


def points_rows(split: Mapping[str, object]) -> dict[str, str]:
    """The points split as rows of the decomposition table (strings: shown as written)."""
    rows = {"gap to best single (train-chosen), pts": fmt_points(split["gap"])}
    for key, value in split["parts"].items():
        rows[f"  of which {GAP_PARTS[key]}, pts"] = f"{fmt_points(value)} ({split['workflows'][key]} workflows)"
    return rows


def decomposition_markdown(decompositions: Sequence[dict]) -> str:
    """One row per quantity, one column per conductor arm: a column per quantity would not fit
    the UI's width."""
    metrics = list(dict.fromkeys(key for d in decompositions for key in d if key != "arm"))
    frame = pl.DataFrame(
        {"quantity": metrics, **{d["arm"]: [_cell(d.get(m)) for m in metrics] for d in decompositions}}
    )
    return markdown_table(frame)


def _cell(value: object) -> str:
    if _missing(value):
        return NOT_AVAILABLE
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


# ---------------------------------------------------------------------- cost


def frontier_markdown(
    table: pl.DataFrame, frontier: Sequence[str], labels: Mapping[str, str], reference_cost: float | None
) -> str:
    """Every arm by cost per question, its share of the best single worker's cost, and whether it
    is on the accuracy-vs-cost frontier (no arm is at least as accurate for less)."""
    rows = []
    for r in table.sort("cost_per_question", "accuracy", descending=[False, True]).iter_rows(named=True):
        share = (f"{r['cost_per_question'] / reference_cost:.0%}"
                 if reference_cost else NOT_AVAILABLE)
        rows.append([labels.get(r["arm"], r["arm"]), fmt_cost(r["cost_per_question"]), share,
                     fmt_accuracy(r["accuracy"]), "yes" if r["arm"] in frontier else "-"])
    return github_table(rows, ["arm", "cost / question (USD)", "share of best single's cost", "accuracy", "on the frontier"])


def cost_story_markdown(
    stories: Mapping[str, Mapping[str, dict | None]],
    *,
    reference_label: str,
    reference_accuracy: float,
    reference_cost: float,
    estimated: bool,
    baselines: Mapping[str, PairedComparison],
    baseline_costs: Mapping[str, float],
    labels: Mapping[str, str],
    frontier: Sequence[str],
) -> str:
    """The cost story in sentences: the sweeps' two answers per router, what the vote and cascade
    arms cost, and the frontier."""
    est = " (est.)" if estimated else ""
    lines = [
        f"{reference_label}: {fmt_accuracy(reference_accuracy)} at {fmt_cost(reference_cost)} USD per question{est}."
    ]
    for router, story in stories.items():
        knob = "lambda" if router == "w_router" else "threshold"
        cheapest, half = story["cheapest_not_worse"], story["best_at_half_cost"]
        if cheapest is None:
            lines.append(
                f"- {router}: every configuration swept is worse than {reference_label} by the paired interval."
            )
        else:
            lines.append(
                f"- {router}, cheapest configuration not worse than {reference_label}: "
                f"{knob} = {cheapest['value']:.3g}, "
                f"{fmt_accuracy(cheapest['accuracy'])} ({_sweep_difference(cheapest)}, {cheapest['verdict']}) at "
                f"{fmt_cost(cheapest['cost_per_question'])} USD = {fmt_share(cheapest['cost_share'])} of its cost."
            )
        if half is None:
            lines.append(f"- {router} at half of {reference_label}'s cost: no configuration is that cheap.")
        else:
            lines.append(
                f"- {router} at half of {reference_label}'s cost: {fmt_accuracy(half['accuracy'])} "
                f"({_sweep_difference(half)}, {half['verdict']}; {knob} = {half['value']:.3g}, "
                f"{fmt_share(half['cost_share'])} of its cost)."
            )
    for arm, c in baselines.items():
        cost = baseline_costs.get(arm)
        share = fmt_share(cost / reference_cost) if cost is not None and reference_cost else NOT_AVAILABLE
        lines.append(
            f"- {labels.get(arm, arm)}: {fmt_accuracy(c.arm_accuracy)} ({fmt_estimate_points(c.difference)} pts, "
            f"**{c.verdict}**) at {fmt_cost(cost)} USD per question{est} = {share} of {reference_label}'s cost."
        )
    if frontier:
        lines.append(f"- Frontier (cheapest first): {' -> '.join(labels.get(a, a) for a in frontier)}.")
    lines.append(
        "\nSweeps are computed from the solo arms' recorded verdicts and costs on the same questions (each "
        "configuration's call is the solo call of the worker it picks); each has the paired bootstrap, not "
        "adjusted for the many configurations: a correction would let worse ones pass as not worse."
    )
    return "\n".join(lines)


def fmt_share(value: float | None) -> str:
    return NOT_AVAILABLE if _missing(value) else f"{value:.0%}"


def _sweep_difference(row: Mapping[str, object]) -> str:
    estimate = Estimate(row["difference"], row["difference_low"], row["difference_high"])
    return f"{fmt_estimate_points(estimate)} pts"


# ---------------------------------------------------------------------- routing summary


def routing_summary_markdown(
    *,
    pool: str,
    eval_population: str,
    w_router: PairedComparison | None,
    oracle_accuracy: float | None,
    report: Mapping[str, object] | None,
    ceilings: Mapping[str, object] | None,
) -> str:
    """One routing summary per pool: this run's W-router on the eval slice beside the cross-validated
    world-model report and the probe ceilings, each with the population it is measured on."""
    headers = ["figure", "population", "questions", "best single", "oracle", "W-router",
               "W-router - best single (pts) [95% CI]", "oracle headroom recovered [95% CI]"]
    rows = []
    if w_router is not None:
        rows.append(["eval_tables (this run)", eval_population, str(w_router.n_questions),
                     fmt_accuracy(w_router.reference_accuracy), fmt_accuracy(oracle_accuracy),
                     fmt_accuracy(w_router.arm_accuracy), fmt_estimate_points(w_router.difference),
                     fmt_share_estimate(w_router.headroom_recovered)])
    else:
        rows.append(["eval_tables (this run)", eval_population, NOT_AVAILABLE, NOT_AVAILABLE, NOT_AVAILABLE,
                     "no W-router arm", NOT_AVAILABLE, NOT_AVAILABLE])
    if report is not None:
        rows.append(["world_model_report (latest)", str(report.get("population") or REPORT_POPULATION),
                     str(report["questions"]), fmt_accuracy(report["best_single"]), fmt_accuracy(report["oracle"]),
                     fmt_accuracy(report["w_router"]), fmt_points(report["w_router"] - report["best_single"]),
                     fmt_share_estimate(Estimate(*report["headroom_recovered"]))])
    else:
        rows.append(["world_model_report (latest)", REPORT_POPULATION, *[NOT_AVAILABLE] * 5, "not materialized"])
    if ceilings:
        rows.append(["oracle_ceilings (latest)", CEILING_POPULATION, str(ceilings.get("n_questions", NOT_AVAILABLE)),
                     fmt_accuracy(ceilings.get("best_single")), fmt_accuracy(ceilings.get("oracle")),
                     NOT_AVAILABLE, NOT_AVAILABLE, NOT_AVAILABLE])
    text = f"Routing on pool `{pool}`\n\n" + github_table(rows, headers)
    text += (
        "\n\nWhy the figures differ: they are measured on different questions. The eval slice is only "
        f"{eval_population}; the report and the ceilings count every probed question, other corpora and "
        "levels included, so their accuracies sit on another scale. The report also re-chooses the best single "
        "worker on each resample, where the eval slice keeps the one chosen on the train split."
    )
    return text


def describe_eval_population(corpus: str, math_levels: Sequence[int], *, restricted_to_recorded: bool) -> str:
    """The eval slice's population in words, e.g. `math level 5, eval split, recorded by every seat`."""
    levels = f" level {', '.join(map(str, math_levels))}" if corpus == "math" and math_levels else ""
    recorded = ", recorded by every seat" if restricted_to_recorded else ""
    return f"{corpus}{levels}, eval split{recorded}"
