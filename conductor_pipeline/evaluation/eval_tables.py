"""Everything an evaluation run publishes, computed once from its recorded workflows.

`build_eval_tables` is what `eval_tables` shows: the arm table, every arm paired against the best
single worker, the conductor's verdict and its gap in points, the cost sweeps, story and frontier,
the routing summary, usage, parse codes, the running gap and the decomposition, as frames, markdown
(in reading order) and plots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import polars as pl

from conductor_pipeline.evaluation.arms import EvalRunSummary, VoteArm
from conductor_pipeline.evaluation.cascades import CascadeArm, cascade_comparisons, cascade_stops
from conductor_pipeline.evaluation.comparisons import (
    DEFAULT_PAIRED,
    REFERENCE_ARM,
    PairedSettings,
    compare_with_reference,
    comparisons_frame,
    conductor_arms,
    gap_in_points,
    question_scores,
)
from conductor_pipeline.evaluation.costs import arms_frontier, cost_story, cost_sweep
from conductor_pipeline.evaluation.frames import (
    GAP_FIRST_N,
    arm_table,
    common_questions,
    conductor_decompositions,
    fan_out_by_arm,
    is_recursive_arm,
    parse_code_histogram,
    recursion_table,
    routing_value,
    running_gap,
    worker_usage,
)
from conductor_pipeline.evaluation.learning import conductor_comparisons, order_agreement, steps_by_position
from conductor_pipeline.evaluation.learning_markdown import (
    cascades_markdown,
    conductor_comparisons_markdown,
    order_invariance_markdown,
    positions_markdown,
)
from conductor_pipeline.evaluation.markdown import (
    arm_labels,
    arm_table_markdown,
    conductor_summary,
    cost_story_markdown,
    decomposition_markdown,
    describe_eval_population,
    frontier_markdown,
    markdown_table,
    paired_table_markdown,
    points_rows,
    routing_summary_markdown,
    verdict_lines,
)
from conductor_pipeline.evaluation.plots import accuracy_cost_plot, running_gap_plot
from conductor_pipeline.evaluation.routers import OracleRouter, WCascadeRouter, WorldModelRouter
from conductor_pipeline.stats import PairedComparison

# No nested workflows recorded: the recursion table then says so (zero everywhere).
_NO_INNER = pl.DataFrame(
    schema={"root_workflow_id": pl.String, "n_steps": pl.Int64, "parse_code": pl.String, "depth": pl.Int64}
)


@dataclass(frozen=True)
class OtherFigures:
    """Other assets' routing figures for this pool, set beside this run's in the routing summary:
    the cross-validated world-model report's (`RoutingReport.figures`) and the probe ceilings
    (n_questions, best_single, oracle). None: not materialized."""

    report: Mapping[str, object] | None = None
    ceilings: Mapping[str, object] | None = None


@dataclass(frozen=True)
class EvalTables:
    """One run's tables; `markdown` maps each published entry to its text, in reading order."""

    table: pl.DataFrame
    gap: pl.DataFrame
    comparisons: dict[str, PairedComparison]
    sweep: pl.DataFrame
    n_common: int
    conductor_verdicts: dict[str, str]
    routing: dict[str, object] | None
    markdown: dict[str, str] = field(default_factory=dict)
    accuracy_png: bytes = b""
    gap_png: bytes = b""
    recursion: pl.DataFrame | None = None  # per recursive conductor arm; None when no arm recursed
    # Did the conductor learn to route: each conductor arm against its references, its steps per
    # catalogue position, and its choices under the pool-file order against a shuffled catalogue.
    conductor_pairs: pl.DataFrame | None = None
    positions: pl.DataFrame | None = None
    order_agreement: pl.DataFrame | None = None
    # Each arm's score per question: what pools this run with other seeds' (`assets/results.py` reads it).
    question_scores: pl.DataFrame | None = None

    def frames(self) -> dict[str, pl.DataFrame]:
        """The run's tables as data, by name, the ones this run has: what is written beside it as parquet."""
        optional = {
            "question_scores": self.question_scores, "recursion": self.recursion,
            "conductor_pairs": self.conductor_pairs, "positions": self.positions,
            "order_agreement": self.order_agreement, "cost_sweep": self.sweep if self.sweep.height else None,
        }
        return {
            "arms": self.table, "running_gap": self.gap, "paired": comparisons_frame(self.comparisons),
            **{name: frame for name, frame in optional.items() if frame is not None},
        }


def build_eval_tables(
    summary: EvalRunSummary,
    workflows: pl.DataFrame,
    call_tokens: pl.DataFrame | None,
    *,
    settings: PairedSettings = DEFAULT_PAIRED,
    others: OtherFigures | None = None,
    inline_chars: int | None = None,
    fan_out: pl.DataFrame | None = None,
    inner_workflows: pl.DataFrame | None = None,
) -> EvalTables:
    """Every table of the run `summary` names from its `workflows` (and per-workflow `call_tokens`).

    `fan_out`: the run's `sql/workflow_fan_out.sql` rows on a pool with a vote seat; how each
    conductor arm spent is then published (`fan_out`: the share of workflows that fanned out and
    aggregated, that made more than one model call, that an agreeing vote stopped early, right and
    wrong, and the cost per question).
    `inner_workflows` (eval_inner_workflows: what the conductor seat wrote inside them) gives the
    recursion table of each recursive conductor arm, whatever recursion did there.

    `inline_chars`: the verdict lines and the conductors' summary are shortened until they fit (the UI shows shorter markdown
    without a click). Verdicts and sweeps use `settings` for every paired interval.
    """
    others = others or OtherFigures()
    extra = summary.extra
    order = list(summary.slice_ids)
    table = arm_table(
        workflows, planned_size=summary.planned_size, call_tokens=call_tokens, slice_order=order,
        available=len(summary.slice_ids), arm_order=summary.arms,
        single_recording_workers=extra.get("single_recording_workers", ()),
    )
    gap = running_gap(workflows, slice_order=order)
    common = common_questions(workflows)
    comparisons = compare_with_reference(workflows, settings=settings)
    arms = table["arm"].to_list()
    labels = arm_labels(arms, best_single_worker=summary.best_single_worker, replayed=bool(extra.get("replayed")))
    reference_label = labels.get(REFERENCE_ARM, REFERENCE_ARM)
    shown = [arm for arm in arms if arm != REFERENCE_ARM]
    conductors = conductor_arms(arms)
    recursive = [arm for arm in conductors if is_recursive_arm(arm)]
    recursion = (
        recursion_table(workflows, inner_workflows if inner_workflows is not None else _NO_INNER, recursive)
        if recursive else None
    )
    points = {arm: split for arm in conductors if (split := gap_in_points(workflows, arm)) is not None}
    routing = routing_value(table, WorldModelRouter.name)
    decompositions = conductor_decompositions(
        workflows, common, context={WorldModelRouter.name: routing["accuracy"]} if routing else None
    )
    for decomposition in decompositions:
        if decomposition["arm"] in points:
            decomposition.update(points_rows(points[decomposition["arm"]]))

    pairs = conductor_comparisons(
        workflows, conductors, started_from=extra.get("started_from", {}), order_twins=extra.get("order_twins", {}),
        settings=settings,
    )
    positions = steps_by_position(workflows.filter(pl.col("arm").is_in(conductors)))
    agreement = order_agreement(workflows, extra.get("order_twins", {}))
    cost = dict(zip(arms, table["cost_per_question"].to_list(), strict=True))
    accuracy = dict(zip(arms, table["accuracy"].to_list(), strict=True))
    frontier = arms_frontier(table)
    predictions = extra.get("routing_predictions")
    sweep = cost_sweep(workflows, predictions, settings=settings) if predictions is not None else pl.DataFrame()
    routers = dict.fromkeys(sweep["router"].to_list()) if sweep.height else {}
    baselines = {arm: comparisons[arm] for arm in arms
                 if arm in comparisons and arm.startswith((VoteArm.PREFIX, CascadeArm.PREFIX, WCascadeRouter.family))}
    stops = cascade_stops(workflows, extra.get("cascade_first_stage", {}))
    cascade_pairs = cascade_comparisons(workflows, extra.get("cascade_votes", {}), settings=settings)
    population = describe_eval_population(
        summary.corpus, extra.get("math_levels", ()), restricted_to_recorded=bool(extra.get("restricted_to_recorded"))
    )
    markdown = {
        "conductor_vs_best_single": conductor_summary(
            comparisons, conductors, points, reference_label=reference_label, max_chars=inline_chars
        ),
        "verdicts": verdict_lines(comparisons, shown, labels, reference_label=reference_label, max_chars=inline_chars),
        "arm_table": arm_table_markdown(table, labels),
        "paired_vs_best_single": paired_table_markdown(comparisons, shown, labels),
        "conductor_pairs": conductor_comparisons_markdown(pairs, labels),
        "order_invariance": order_invariance_markdown(agreement, pairs, labels),
        "steps_by_position": positions_markdown(positions, labels),
        "cost_story": cost_story_markdown(
            {router: cost_story(sweep, router) for router in routers}, reference_label=reference_label,
            reference_accuracy=accuracy.get(REFERENCE_ARM, float("nan")), reference_cost=cost.get(REFERENCE_ARM) or 0.0,
            estimated=bool(table["tokens_estimated"].fill_null(False).any()), baselines=baselines,
            baseline_costs=cost, labels=labels, frontier=frontier,
        ),
        "cost_frontier": frontier_markdown(table, frontier, labels, cost.get(REFERENCE_ARM)),
        "routing_value": routing_summary_markdown(
            pool=str(extra.get("pool", "")), eval_population=population,
            w_router=comparisons.get(WorldModelRouter.name), oracle_accuracy=accuracy.get(OracleRouter.name),
            report=others.report, ceilings=others.ceilings,
        ),
        "worker_usage": markdown_table(worker_usage(workflows)),
        "parse_codes": markdown_table(parse_code_histogram(workflows)),
        **({"recursion": markdown_table(recursion)} if recursion is not None else {}),
        **({"cascades": cascades_markdown(stops, cascade_pairs, labels)} if stops.height else {}),
        "running_gap": markdown_table(gap) if gap.height else f"fewer than {GAP_FIRST_N} common questions",
        "decomposition": decomposition_markdown(decompositions) if decompositions else "no conductor arm",
    }
    if fan_out is not None:
        shares = fan_out_by_arm(fan_out.filter(pl.col("arm").is_in(conductors))).with_columns(
            pl.col("arm").replace_strict(cost, default=None, return_dtype=pl.Float64).alias("cost_per_question")
        )
        markdown["fan_out"] = markdown_table(shares) if shares.height else "no conductor arm"
    return EvalTables(
        table=table,
        gap=gap,
        comparisons=comparisons,
        sweep=sweep,
        n_common=len(common),
        conductor_verdicts={arm: comparisons[arm].verdict if arm in comparisons else "cannot be compared with"
                            for arm in conductors},
        routing=routing,
        markdown=markdown,
        accuracy_png=accuracy_cost_plot(table, frontier=frontier, sweep=sweep, labels=labels, reference=REFERENCE_ARM),
        gap_png=running_gap_plot(gap),
        recursion=recursion,
        conductor_pairs=pairs,
        positions=positions,
        order_agreement=agreement,
        question_scores=question_scores(workflows),
    )
