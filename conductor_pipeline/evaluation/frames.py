"""The frames an evaluation run gives: accuracy with intervals, cost, usage, gap, decomposition
(`markdown` turns them into the markdown the UI shows)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import polars as pl

from conductor_pipeline.evaluation.arms import ConductorArm, SoloArm
from conductor_pipeline.evaluation.routers import BestSingleRouter, OracleRouter
from conductor_pipeline.stats import wilson_interval
from conductor_pipeline.warehouse import sql_row_over_frames

GAP_FIRST_N = 50  # below 50 questions a gap is mostly noise: the running gap starts here
GAP_EVERY_N = 25
# The SE cell of an arm whose repeats are one sample: every repeat replayed the same recording, or
# (live) every repeat gave the same workflow and verdict.
ONE_RECORDING = "n/a (one recording)"
IDENTICAL_REPEATS = "n/a (identical repeats)"
Z_95 = 1.959963984540054


# ---------------------------------------------------------------------- tables


def common_questions(workflows: pl.DataFrame) -> list[str]:
    """Questions every (arm, repeat) reached without an infrastructure failure."""
    pairs = workflows.select("arm", "repeat").unique().height
    reached = (
        workflows.filter(~pl.col("infra_failure"))
        .group_by("question_id")
        .agg(pl.struct("arm", "repeat").n_unique().alias("pairs"))
        .filter(pl.col("pairs") == pairs)
    )
    return sorted(reached["question_id"].to_list())


def _ordered_common(workflows: pl.DataFrame, slice_order: Sequence[str] | None) -> list[str]:
    common = set(common_questions(workflows))
    if slice_order is None:
        return sorted(common)
    return [qid for qid in slice_order if qid in common]


def n_label(n: int, attempted: int, planned: int, available: int | None = None) -> str:
    """`n=380 of 400 planned`, and says why when fewer were scored than planned.

    `available` is how many eligible questions the slice actually held: a slice that is smaller
    than planned is a property of the data, not a run that stopped early.
    """
    label = f"n={n} of {planned} planned"
    available = planned if available is None else min(available, planned)
    if available < planned and attempted >= available:
        label += f" (the eval split holds only {available} eligible questions)"
    elif attempted < available:
        label += f" (stopped early: {attempted} of {available} questions run)"
    elif n < attempted:
        label += f" ({attempted - n} excluded: infrastructure failures)"
    return label


def arm_kind(arm: str) -> str:
    """`worker` (a solo arm), `conductor`, or `baseline` (routers, votes, cascades): the table's groups."""
    if arm.startswith(SoloArm.PREFIX):
        return "worker"
    if arm.startswith(ConductorArm.PREFIX):
        return "conductor"
    return "baseline"


def ordered_arms(accuracy: Mapping[str, float], arm_order: Sequence[str] | None = None) -> list[str]:
    """Workers (most accurate first), then baselines, then conductors; within those two groups the
    lineup's order (`arm_order`), else by name."""
    position = {arm: i for i, arm in enumerate(arm_order or ())}

    def key(arm: str) -> tuple:
        kind = ("worker", "baseline", "conductor").index(arm_kind(arm))
        within = -accuracy[arm] if kind == 0 else position.get(arm, len(position))
        return kind, within, arm

    return sorted(accuracy, key=key)


def _identical_repeats(frame: pl.DataFrame) -> bool:
    """Whether every question got the same workflow and verdict in every repeat of one arm."""
    outcome = pl.struct(pl.col("workers"), pl.col("final_answer"), pl.col("correct"), pl.col("parse_code"))
    per_question = frame.group_by("question_id").agg(outcome.n_unique().alias("outcomes"))
    return bool(per_question["outcomes"].max() == 1)


def arm_table(
    workflows: pl.DataFrame,
    *,
    planned_size: int,
    call_tokens: pl.DataFrame | None = None,
    slice_order: Sequence[str] | None = None,
    available: int | None = None,
    arm_order: Sequence[str] | None = None,
    single_recording_workers: Collection[str] = (),
) -> pl.DataFrame:
    """One row per arm on the common questions: accuracy (mean over repeats, SE, 95% interval),
    cost, latency, tokens and steps per question, and how many questions were run and scored.

    `workflows` has the `workflows` table's columns; `call_tokens` (workflow_id, tokens and
    optionally tokens_estimated) sums the tokens of every call of a workflow, conductor included.
    Repeats that all gave the same workflow and verdict are one sample, not r: their SE is shown as
    not applicable (`se_note`) and the interval is Wilson's over questions. The note says "one
    recording" when every worker the arm used is in `single_recording_workers` (replay seats that
    hold one recording per question), "identical repeats" otherwise. Rows come in `ordered_arms` order.
    """
    common = _ordered_common(workflows, slice_order)
    attempted = workflows["question_id"].n_unique()
    scored = workflows.filter(pl.col("question_id").is_in(common))
    if call_tokens is not None:
        scored = scored.join(call_tokens, on="workflow_id", how="left")
    else:
        scored = scored.with_columns(pl.lit(None, dtype=pl.Float64).alias("tokens"))
    if "tokens_estimated" not in scored.columns:
        scored = scored.with_columns(pl.lit(None, dtype=pl.Boolean).alias("tokens_estimated"))
    single_recording = frozenset(single_recording_workers)
    rows = []
    for arm in scored["arm"].unique().to_list():
        frame = scored.filter(pl.col("arm") == arm)
        per_repeat = (
            frame.group_by("repeat").agg(pl.col("correct").cast(pl.Float64).mean().alias("accuracy")).sort("repeat")
        )
        accuracies = per_repeat["accuracy"].to_list()
        repeats = len(accuracies)
        mean = sum(accuracies) / repeats if repeats else float("nan")
        n = len(common)
        se_note = None
        if repeats > 1 and not _identical_repeats(frame):
            sd = math.sqrt(sum((a - mean) ** 2 for a in accuracies) / (repeats - 1))
            se = sd / math.sqrt(repeats)
            low, high = max(0.0, mean - Z_95 * se), min(1.0, mean + Z_95 * se)
            method = "mean +- 1.96 SE over repeats"
        elif repeats > 1:
            used = set(frame["workers"].explode().drop_nulls().to_list())
            se_note = ONE_RECORDING if used and used <= single_recording else IDENTICAL_REPEATS
            se = None
            low, high = (float(v) for v in wilson_interval(round(mean * n), n))
            method = f"Wilson over questions ({se_note})"
        else:
            se = math.sqrt(mean * (1 - mean) / n) if n else float("nan")
            low, high = (float(v) for v in wilson_interval(round(mean * n), n)) if n else (math.nan, math.nan)
            method = "Wilson (one repeat)"
        parsed = frame.filter(pl.col("parse_code") == "ok")
        estimated = frame["tokens_estimated"].drop_nulls()
        rows.append(
            {
                "arm": arm,
                "kind": arm_kind(arm),
                "n": n,
                "n_label": n_label(n, attempted, planned_size, available),
                "repeats": repeats,
                "accuracy": mean,
                "se": se,
                "se_note": se_note,
                "ci_low": low,
                "ci_high": high,
                "interval": method,
                "cost_per_question": frame["cost_usd"].fill_null(0.0).mean(),
                # Unknown latency (replay records none) stays unknown rather than reading as 0 s.
                "latency_per_question_s": frame["latency_s"].mean(),
                "tokens_per_question": frame["tokens"].mean(),
                # Whether any call's token counts (and so its cost) were estimated, not reported.
                "tokens_estimated": bool(estimated.any()) if len(estimated) else None,
                "mean_steps": parsed["n_steps"].mean() if parsed.height else None,
                "parse_ok_share": parsed.height / frame.height if frame.height else None,
            }
        )
    order = ordered_arms({row["arm"]: row["accuracy"] for row in rows}, arm_order)
    rows.sort(key=lambda row: order.index(row["arm"]))
    schema = {"se": pl.Float64, "se_note": pl.String, "tokens_estimated": pl.Boolean, "mean_steps": pl.Float64,
              "latency_per_question_s": pl.Float64, "tokens_per_question": pl.Float64, "parse_ok_share": pl.Float64}
    return pl.DataFrame(rows, schema_overrides=schema, infer_schema_length=None)


def worker_usage(workflows: pl.DataFrame) -> pl.DataFrame:
    """Per arm, the share of steps each worker took (over parsed, non-infra workflows)."""
    steps = (
        workflows.filter((pl.col("parse_code") == "ok") & ~pl.col("infra_failure"))
        .select("arm", "workers")
        .explode("workers")
        .drop_nulls("workers")
        .rename({"workers": "worker"})
    )
    return (
        steps.group_by("arm", "worker")
        .agg(pl.len().alias("steps"))
        .with_columns((pl.col("steps") / pl.col("steps").sum().over("arm")).alias("share"))
        .sort("arm", "share", descending=[False, True])
    )


def fan_out_by_arm(flags: pl.DataFrame) -> pl.DataFrame:
    """Per arm, how it spent: the share of its workflows (infrastructure failures left out) that
    fanned out to several workers and aggregated them with a vote seat, the share that made more
    than one model call, and how often an agreeing vote stopped it early, right and wrong. `flags`
    are the rows of `sql/workflow_fan_out.sql`."""
    scored = flags.filter(~pl.col("infra_failure").fill_null(False))
    stopped = pl.col("stopped_early")
    return (
        scored.group_by("arm")
        .agg(
            pl.len().alias("workflows"),
            pl.col("fans_out").sum().alias("fan_out"),
            (pl.col("model_calls") > 1).mean().alias("more_than_one_call"),
            stopped.sum().alias("stopped_early"),
            (stopped & pl.col("correct").fill_null(False)).sum().alias("stopped_right"),
            (stopped & ~pl.col("correct").fill_null(False)).sum().alias("stopped_wrong"),
        )
        .with_columns((pl.col("fan_out") / pl.col("workflows")).alias("share"))
        .select("arm", "workflows", "fan_out", "share", "more_than_one_call", "stopped_early", "stopped_right",
                "stopped_wrong")
        .sort("arm")
    )


def parse_code_histogram(workflows: pl.DataFrame) -> pl.DataFrame:
    """Per arm and parse code, how many workflows (infra failures left out: they are not outputs)."""
    return (
        workflows.filter(~pl.col("infra_failure"))
        .group_by("arm", "parse_code")
        .agg(pl.len().alias("workflows"))
        .sort("arm", "workflows", descending=[False, True])
    )


def _per_question_accuracy(frame: pl.DataFrame) -> dict[str, float]:
    means = frame.group_by("question_id").agg(pl.col("correct").cast(pl.Float64).mean().alias("acc"))
    return dict(zip(means["question_id"].to_list(), means["acc"].to_list(), strict=True))


def best_solo_arm(workflows: pl.DataFrame, common: Sequence[str]) -> str | None:
    """The most accurate solo arm on the common questions (ties: smallest name)."""
    solo = workflows.filter(pl.col("arm").str.starts_with(SoloArm.PREFIX) & pl.col("question_id").is_in(list(common)))
    if solo.height == 0:
        return None
    ranked = (
        solo.group_by("arm").agg(pl.col("correct").cast(pl.Float64).mean().alias("acc"))
        .sort(["acc", "arm"], descending=[True, False])
    )
    return ranked["arm"][0]


def running_gap(
    workflows: pl.DataFrame,
    *,
    slice_order: Sequence[str] | None = None,
    first_n: int = GAP_FIRST_N,
    every_n: int = GAP_EVERY_N,
) -> pl.DataFrame:
    """Each arm's accuracy minus the best solo worker's on the first n common questions,
    at n = first_n, first_n + every_n, ... (slice order), so nobody reads a stopping point as a result.
    """
    common = _ordered_common(workflows, slice_order)
    best = best_solo_arm(workflows, common)
    if best is None:
        return pl.DataFrame(schema={"arm": pl.String, "n": pl.Int64, "accuracy": pl.Float64, "gap": pl.Float64})
    scored = workflows.filter(pl.col("question_id").is_in(common))
    best_acc = _per_question_accuracy(scored.filter(pl.col("arm") == best))
    rows = []
    for arm in sorted(scored["arm"].unique().to_list()):
        acc = _per_question_accuracy(scored.filter(pl.col("arm") == arm))
        for n in range(first_n, len(common) + 1, every_n):
            prefix = common[:n]
            arm_mean = sum(acc[q] for q in prefix) / n
            best_mean = sum(best_acc[q] for q in prefix) / n
            rows.append({"arm": arm, "n": n, "accuracy": arm_mean, "gap": arm_mean - best_mean, "best_solo": best})
    return pl.DataFrame(rows, schema={"arm": pl.String, "n": pl.Int64, "accuracy": pl.Float64, "gap": pl.Float64, "best_solo": pl.String})


def routing_value(
    table: pl.DataFrame, arm: str, *, best_single_arm: str = BestSingleRouter.name, oracle_arm: str = OracleRouter.name
) -> dict[str, object] | None:
    """A router's accuracy beside best single and oracle on the same (common) questions, and the
    share of the oracle headroom it recovers: (arm - best_single) / (oracle - best_single), like
    RouteLLM's APGR. 1 = as good as the oracle, 0 = no better than best single, < 0 = worse.
    None when an arm is missing; the share is None when the oracle has no headroom.
    """
    accuracy = dict(zip(table["arm"].to_list(), table["accuracy"].to_list(), strict=True)) if table.height else {}
    if not {arm, best_single_arm, oracle_arm} <= set(accuracy):
        return None
    headroom = accuracy[oracle_arm] - accuracy[best_single_arm]
    return {
        "arm": arm,
        "n": int(table.filter(pl.col("arm") == arm)["n"][0]),
        "accuracy": accuracy[arm],
        "best_single": accuracy[best_single_arm],
        "oracle": accuracy[oracle_arm],
        "headroom_recovered": (accuracy[arm] - accuracy[best_single_arm]) / headroom if headroom > 0 else None,
    }


# ---------------------------------------------------------------------- the decomposition


def decompose_gap(outcomes: pl.DataFrame, conductor_outcomes: pl.DataFrame) -> dict[str, object]:
    """Run `sql/conductor_decomposition.sql` on the two relations; returns its one row as a dict.

    In-memory DuckDB: the relation names are the SQL's contract, and the warehouse's own
    `outcomes` view (probe majorities) must not shadow the eval arms' solo outcomes.
    """
    return sql_row_over_frames(
        "conductor_decomposition",
        outcomes=outcomes.select("question_id", "worker", "correct"),
        conductor_outcomes=conductor_outcomes.select("question_id", "parse_code", "correct", "workers"),
    )


def decomposition_inputs(
    workflows: pl.DataFrame, conductor_arm: str, common: Sequence[str]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(solo outcomes, conductor outcomes) on the common questions, from eval-arm workflows.

    Solo outcome = majority over repeats (as the `outcomes` view does for probes); the conductor
    contributes its repeat-0 workflow, whose parse code, workers and verdict belong together.
    """
    rows = workflows.filter(pl.col("question_id").is_in(list(common)))
    solo = (
        rows.filter(pl.col("arm").str.starts_with(SoloArm.PREFIX))
        .with_columns(pl.col("arm").str.strip_prefix(SoloArm.PREFIX).alias("worker"))
        .group_by("question_id", "worker")
        .agg((2 * pl.col("correct").cast(pl.Int64).sum() > pl.len()).alias("correct"))
    )
    conductor = rows.filter((pl.col("arm") == conductor_arm) & (pl.col("repeat") == 0)).select(
        "question_id", "parse_code", "correct", "workers"
    )
    return solo, conductor


def conductor_decompositions(
    workflows: pl.DataFrame, common: Sequence[str], *, context: dict[str, object] | None = None
) -> list[dict[str, object]]:
    """The gap decomposition of every conductor arm that has solo and conductor rows on the common
    questions, in arm-name order; `context` (e.g. the W-router's accuracy) is added to each row."""
    decompositions = []
    for arm in sorted(a for a in workflows["arm"].unique().to_list() if a.startswith(ConductorArm.PREFIX)):
        solo, conductor_rows = decomposition_inputs(workflows, arm, common)
        if solo.height and conductor_rows.height:
            decompositions.append({"arm": arm, **decompose_gap(solo, conductor_rows), **(context or {})})
    return decompositions


def is_recursive_arm(arm: str) -> bool:
    """A conductor arm whose pool seats the conductor (its workflows may call it again)."""
    return arm.startswith(ConductorArm.PREFIX) and arm.endswith(ConductorArm.RECURSIVE_SUFFIX)


def recursion_table(workflows: pl.DataFrame, inner: pl.DataFrame, arms: Sequence[str]) -> pl.DataFrame:
    """What recursion did, per arm, over its top-level workflows that reached an answer (no
    infrastructure failure): steps per workflow at the top level and counting the steps of the
    workflows nested in it, nested workflows (`inner`: eval_inner_workflows rows, one per reply of
    the conductor seat), the share of workflows that recursed (some reply was a workflow with
    steps), replies that passed the answer through (three empty lists) or did not parse, the
    deepest level reached, and the accuracy of workflows that recursed and of those that did not."""
    rows = []
    for arm in arms:
        top = workflows.filter((pl.col("arm") == arm) & ~pl.col("infra_failure"))
        nested = inner.filter(pl.col("root_workflow_id").is_in(top["workflow_id"].to_list()))
        per_root = nested.group_by("root_workflow_id").agg(
            pl.col("n_steps").sum().alias("inner_steps"), (pl.col("n_steps") > 0).any().alias("recursed")
        )
        joined = top.join(per_root, left_on="workflow_id", right_on="root_workflow_id", how="left").with_columns(
            pl.col("inner_steps").fill_null(0), pl.col("recursed").fill_null(False)
        )
        recursed, flat = joined.filter(pl.col("recursed")), joined.filter(~pl.col("recursed"))
        rows.append({
            "arm": arm,
            "workflows": top.height,
            "steps_top_level": _mean_or_none(joined["n_steps"]),
            "steps_with_inner": _mean_or_none(joined["n_steps"] + joined["inner_steps"]),
            "inner_workflows": nested.height,
            "share_recursed": recursed.height / top.height if top.height else None,
            "pass_throughs": nested.filter((pl.col("parse_code") == "ok") & (pl.col("n_steps") == 0)).height,
            "inner_unparsed": nested.filter(pl.col("parse_code") != "ok").height,
            "max_depth": int(nested["depth"].max()) if nested.height else 0,
            "accuracy_recursed": _mean_or_none(recursed["correct"].cast(pl.Float64)),
            "n_recursed": recursed.height,
            "accuracy_not_recursed": _mean_or_none(flat["correct"].cast(pl.Float64)),
            "n_not_recursed": flat.height,
        })
    return pl.DataFrame(rows)


def _mean_or_none(values: pl.Series) -> float | None:
    mean = values.drop_nulls().mean()
    return None if mean is None else float(mean)
