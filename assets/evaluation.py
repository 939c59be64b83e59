"""Evaluation assets: every worker solo, the baselines and each conductor on a fixed eval slice.

`eval_arms` runs the arms through the orchestrator (rows land in `calls` and `workflows` under
one evaluation run id, resumable: a rerun skips recorded workflows); `eval_tables` turns those
rows into the arm table, every arm paired against the best single worker (verdict lines), the
conductor's verdict (also a warning check), the cost story and frontier, the routing summary
beside `world_model_report` and `oracle_ceilings`, usage shares, parse codes, the running gap,
the gap decomposition and, for each recursive conductor arm (the pool seats the conductor), what
recursion did. A rerun of the same run retries the workflows that ended in an infrastructure failure. `eval_arms` depends on `conductor_checkpoint` and `world_model` for lineage
only: it reads the checkpoint from the event log and fits its own train-split W, so it runs
whether or not they materialized.

A blocking check fails when a question used for training or for choosing the best single
worker appears in the eval slice, or when the world model that routes (the W-router arm) or
fills conductor prompts saw an eval-split question: that W is fitted here, on the warehouse's
scored rows of TRAIN-split questions for this pool's workers (a small LightGBM fit), not loaded
from the `world_model` asset, whose W saw every question.

The default conductor is the tiny offline HF model (random weights, CPU): it proves the path end
to end, so it runs only with `include_untrained` (then shown as the weak arm it is); configure a
checkpoint or an endpoint on the `conductor` resource for a real result. A local checkpoint
generates the workflows of many questions per forward pass (`HFLocalPolicy.propose_batch`).
"""

# No `from __future__ import annotations`: Dagster reads the config parameter's annotation as a class.
import asyncio
from collections.abc import Mapping, Sequence

import dagster as dg

from assets.evaluation_config import EvalArmsConfig, EvalTablesConfig
from assets.evaluation_inputs import (
    CHECKPOINT_ASSET,
    RoutingInputs,
    TrainedPolicy,
    latest_warm_start,
    probe_ceilings,
    questions_seen_in_training,
    routing_inputs,
    trained_policy,
    world_model_routing,
)
from assets.evaluation_metadata import (
    CONDUCTOR_CHECK,
    conductor_check_result,
    eval_arms_metadata,
    eval_tables_metadata,
)
from assets.metadata import stage
from assets.probing import pass_rates
from conductor_pipeline.conductor.prompt import PromptSpec, read_trained_prompt
from conductor_pipeline.evaluation.arms import ConductorArm, EvalRunSummary
from conductor_pipeline.evaluation.cascades import CascadeChoice
from conductor_pipeline.evaluation.eval_tables import OtherFigures, build_eval_tables
from conductor_pipeline.evaluation.lineup import (
    ArmLineup,
    ConductorTwins,
    conductor_twins,
    eval_lineup,
    eval_run_id,
    run_lineup,
    train_split_cascades,
)
from conductor_pipeline.evaluation.routers import BestSingleChoice, choose_best_single
from conductor_pipeline.evaluation.slices import (
    DrawnSlice,
    assert_no_leak,
    draw_slice,
    find_leaks,
    population,
)
from conductor_pipeline.files import write_bytes_atomic, write_parquet_atomic
from conductor_pipeline.grading.regrade import StaleGradesError, require_current_grades
from conductor_pipeline.pools.backends.base import RecordedWorker, Worker
from conductor_pipeline.pools.config import PoolConfig
from conductor_pipeline.probing.pass_rates import pass_rate_table
from conductor_pipeline.records import stable_id
from conductor_pipeline.splits import SplitLeakError, split_fingerprint, split_of
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource

GROUP = "evaluation"
# Read from the event log when present (`latest_metadata_value`), never required.
WORLD_MODEL_ASSET = "world_model"
# Dagster's UI shows markdown shorter than this inline and hides longer markdown behind a click:
# the verdict lines and the conductor's result must be read without one.
UI_INLINE_MARKDOWN_CHARS = 1000


def conductor_resources(
    config: EvalArmsConfig, conductor: ConductorPolicyResource, trained: Sequence[TrainedPolicy]
) -> list[ConductorPolicyResource]:
    """The conductor resource (unless it is the untrained default), the configured checkpoints
    (prompted as they were trained when their folder records it, `read_trained_prompt`, else like
    the resource) and the trained policies (prompted as they were trained); the checkpoints are sampled
    at `checkpoint_temperature` when it is set."""
    chosen = [conductor] if config.use_conductor_resource and (config.include_untrained or not conductor.untrained) else []

    def sampled(prompt: PromptSpec | None) -> PromptSpec | None:
        if config.checkpoint_temperature is None:
            return prompt
        return (prompt or conductor.prompt_spec).model_copy(update={"temperature": config.checkpoint_temperature})

    paths = list(dict.fromkeys(config.conductor_checkpoints))
    chosen += [conductor.with_checkpoint(path, sampled(read_trained_prompt(path))) for path in paths]
    for policy in trained:
        if policy.path not in paths:
            paths.append(policy.path)
            chosen.append(conductor.with_checkpoint(policy.path, sampled(policy.prompt)))
    return chosen


def build_conductor_arms(
    config: EvalArmsConfig, conductors: Sequence[ConductorPolicyResource], pool_config: PoolConfig,
    routing: RoutingInputs,
) -> dict[tuple[str, str], ConductorArm]:
    """Each conductor as an arm per catalogue order (the pool file's, and a shuffled one), keyed by
    (arm label, order); the two orders share one policy. A pool that seats the conductor makes every
    conductor arm recursive (and labelled so)."""
    recursive = any(seat.is_conductor for seat in pool_config.workers)
    orders = ("pool", "shuffled") if config.shuffled_catalogue else ("pool",)
    return {
        (c.arm_label, order): c.build_arm(
            routing.predictor, recursive=recursive, catalogue_order=order, catalogue_seed=config.catalogue_seed,
            policy=policy,
        )
        for c in conductors for policy in [c.build_policy(pool_config.vote_seat_names)]
        for order in orders
    }


def require_no_leak(drawn: DrawnSlice, training_ids: Sequence[str], calibration: BestSingleChoice) -> None:
    """Fail the step before any arm runs when the slice holds a training or calibration question."""
    try:
        assert_no_leak(
            drawn.slice.question_ids, training_ids=training_ids, calibration_ids=calibration.calibration_question_ids
        )
    except SplitLeakError as exc:
        raise dg.Failure(f"train/eval leak before any arm ran: {exc}") from exc


def run_summary(
    config: EvalArmsConfig, pool_config: PoolConfig, workers: Mapping[str, Worker], drawn: DrawnSlice, *,
    run_id: str, lineup: ArmLineup, calibration: BestSingleChoice, training_ids: Sequence[str],
    routing: RoutingInputs, twins: ConductorTwins, cascades: Sequence[CascadeChoice],
) -> EvalRunSummary:
    """What `eval_tables` reads of the run: its slice, arms and the choices made for it."""
    recorded = {name: w for name, w in workers.items() if isinstance(w, RecordedWorker)}
    return EvalRunSummary(
        run_id=run_id, corpus=config.corpus, slice_ids=drawn.slice.question_ids, planned_size=config.slice_size,
        split_fingerprint=drawn.slice.split_fingerprint, repeats=config.repeats, arms=tuple(lineup.names),
        best_single_worker=calibration.worker,
        calibration_question_ids=tuple(sorted(calibration.calibration_question_ids)),
        training_question_ids=tuple(training_ids),
        extra={
            "pool": pool_config.name, "restricted_to_recorded": drawn.restricted_to_recorded, "order": config.order,
            "aggregators": tuple(seat.name for seat in pool_config.workers if seat.is_vote),
            "w_router_lambda_cost": config.w_router_lambda_cost,
            "world_model_training_question_ids": tuple(sorted(routing.model.training_question_ids))
            if routing.model is not None else (),
            "math_levels": tuple(config.math_levels),
            "started_from": twins.started_from,
            "order_twins": twins.order_twins,
            "replayed": len(recorded) == len(workers),
            "single_recording_workers": tuple(sorted(n for n, w in recorded.items() if w.samples_recorded == 1)),
            "routing_predictions": routing.predictions,
            # How many workers each cascade asks before it may stop, and the vote it stops early
            # (eval_tables counts its escalations and pairs it with that vote).
            "cascade_first_stage": {choice.arm().name: len(choice.cascade.first) for choice in cascades},
            "cascade_votes": {choice.arm().name: choice.vote for choice in cascades},
        },
    )


@dg.asset(
    **stage(GROUP),
    # Lineage only: the checkpoint is read from the event log and the routing W is fitted here.
    deps=[pass_rates, dg.AssetKey(CHECKPOINT_ASSET), dg.AssetKey(WORLD_MODEL_ASSET)],
    kinds={"duckdb", "lightgbm"},
)
def eval_arms(
    context: dg.AssetExecutionContext,
    config: EvalArmsConfig,
    warehouse: WarehouseResource,
    pool: PoolResource,
    conductor: ConductorPolicyResource,
) -> dg.Output[EvalRunSummary]:
    """Every worker solo, best-single / random / oracle / W routers, the W-cascade, broadcast-and-vote
    and each conductor on the eval slice."""
    pool_config = pool.load()
    store = warehouse.get_warehouse()
    spec = config.slice_spec()
    # Conductor seats (recursion) are answered by the orchestrator's conductor policy, not a Worker.
    workers = pool.build_workers([s.name for s in pool_config.workers if not s.is_conductor])
    # Solo arms, routers, the slice and the best single are about seats that answer alone (not a vote).
    seats = [s for s in pool_config.workers if s.name in workers and s.answers_alone]
    solo_names = [s.name for s in seats]
    drawn = draw_slice(store, {name: workers[name] for name in solo_names}, spec)
    calibration = choose_best_single(pass_rate_table(store, pool_config.name), solo_names)
    training_ids = questions_seen_in_training(store, context.instance)
    require_no_leak(drawn, training_ids, calibration)

    warm_start = latest_warm_start(context) if config.use_warm_start_policy else None
    checkpoint = trained_policy(context, CHECKPOINT_ASSET, "checkpoint_path") if config.use_trained_checkpoint else None
    conductors = conductor_resources(config, conductor, [p for p in (warm_start, checkpoint) if p is not None])
    routing = (
        routing_inputs(warehouse, pool_config, seats, drawn, calibration, config.world_model, context.log)
        if config.needs_world_model(conductors) else RoutingInputs()
    )
    conductor_arm_of = build_conductor_arms(config, conductors, pool_config, routing)
    cascades = (
        train_split_cascades(
            store, pool_config.name, calibration, solo_names, config.vote_top_k,
            population=[q.question_id for q in population(store, spec)],
        )
        if config.vote_arms and config.agreement_cascades else []
    )
    lineup = eval_lineup(
        seats, calibration, random_seed=config.random_seed,
        world_model=routing.model if config.world_model_router else None, lambda_cost=config.w_router_lambda_cost,
        conductors=list(conductor_arm_of.values()),
        cascade_model=routing.model if config.w_cascade else None, cascade_threshold=config.w_cascade_threshold,
        vote_top_k=config.vote_top_k if config.vote_arms else None,
        agreement_cascades=[choice.arm() for choice in cascades],
    )
    run_id = eval_run_id(
        pool=pool_config.name, spec=spec, repeats=config.repeats, split_fingerprint=drawn.slice.split_fingerprint,
        include_question=config.include_question, max_depth=config.max_depth, arm_names=lineup.names,
        random_seed=config.random_seed, w_router_lambda_cost=config.w_router_lambda_cost,
        arm_inputs=stable_id(
            pool_config.model_dump_json(), calibration.worker,
            routing.predictions.fingerprint() if routing.predictions is not None else None,
            *(c.fingerprint() for c in conductors), *(choice.cascade.describe() for choice in cascades),
        ),
    )
    context.log.info(
        f"eval run {run_id}: {len(drawn.questions)} questions (planned {config.slice_size}), {len(lineup.names)} "
        f"arms x {config.repeats} repeats; best single on {len(calibration.calibration_question_ids)} "
        f"calibration questions: {calibration.worker}"
    )
    asyncio.run(
        run_lineup(
            store, pool_config, workers, drawn.questions, run_id=run_id, lineup=lineup, repeats=config.repeats,
            include_question=config.include_question, max_depth=config.max_depth, log=context.log.info,
        )
    )
    labels = {c.model_path: c.arm_label for c in conductors if c.model_path}
    twins = conductor_twins(
        {key: arm.name for key, arm in conductor_arm_of.items()},
        trained=labels.get(checkpoint.path) if checkpoint is not None else None,
        warm_start=labels.get(warm_start.path) if warm_start is not None else None,
    )
    summary = run_summary(
        config, pool_config, workers, drawn, run_id=run_id, lineup=lineup, calibration=calibration,
        training_ids=training_ids, routing=routing, twins=twins, cascades=cascades,
    )
    return dg.Output(
        summary, metadata=eval_arms_metadata(summary, calibration, cascades, conductors, routing.metadata)
    )


@dg.asset_check(
    asset=eval_arms, blocking=True,
    description="No training, calibration or routing-W question in the eval slice; the routing W saw only train-split questions",
)
def eval_slice_has_no_leak(
    context: dg.AssetCheckExecutionContext, eval_arms: EvalRunSummary, warehouse: WarehouseResource
) -> dg.AssetCheckResult:
    """Re-derived at check time: training questions may have been logged since the slice was cut."""
    store = warehouse.get_warehouse()
    recorded = store.query_file("eval_workflows", {"run_id": eval_arms.run_id})["question_id"].unique().to_list()
    evaluated = set(eval_arms.slice_ids) | set(recorded)
    w_ids = tuple(eval_arms.extra.get("world_model_training_question_ids", ()))
    training_ids = set(eval_arms.training_question_ids) | set(questions_seen_in_training(store, context.instance))
    leaks = find_leaks(evaluated, training_ids=training_ids | set(w_ids), calibration_ids=eval_arms.calibration_question_ids)
    w_on_eval_side = [qid for qid in w_ids if split_of(qid) != "train"]
    fingerprint_ok = eval_arms.split_fingerprint == split_fingerprint()
    return dg.AssetCheckResult(
        passed=not any(leaks.values()) and fingerprint_ok and not w_on_eval_side,
        metadata={
            "eval_questions": len(evaluated),
            "leaked_training": len(leaks["training"]),
            "leaked_calibration": len(leaks["calibration"]),
            "on_train_split": len(leaks["train_split"]),
            "examples": dg.MetadataValue.json({k: v[:5] for k, v in leaks.items()}),
            "split_fingerprint_matches": fingerprint_ok,
            "world_model_training_questions": len(w_ids),
            "world_model_questions_on_eval_split": len(w_on_eval_side),
        },
    )


@dg.asset(
    **stage(GROUP),
    kinds={"duckdb"},
    check_specs=[
        dg.AssetCheckSpec(
            CONDUCTOR_CHECK, asset="eval_tables",
            description="A conductor arm beats the best single worker (paired interval above 0); warns, never blocks",
        )
    ],
)
def eval_tables(
    context: dg.AssetExecutionContext, config: EvalTablesConfig, eval_arms: EvalRunSummary, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Arm table (accuracy with 95% intervals, cost, latency, tokens, steps), every arm paired against
    the best single worker, the conductor's verdict, the cost story, the routing summary, usage,
    parse codes, the running gap, the decomposition of each conductor's gap, the recursion table and,
    on a pool with a vote seat, each conductor arm's fan-out share."""
    store = warehouse.get_warehouse()
    try:
        require_current_grades(store, run_id=eval_arms.run_id)
    except StaleGradesError as exc:
        raise dg.Failure(str(exc)) from exc
    workflows = store.query_file("eval_workflows", {"run_id": eval_arms.run_id})
    if workflows.is_empty():
        raise dg.Failure(f"no workflows recorded for eval run {eval_arms.run_id}: materialize eval_arms first")
    pool = str(eval_arms.extra.get("pool", ""))
    aggregators = sorted(eval_arms.extra.get("aggregators", ()))
    results = build_eval_tables(
        eval_arms,
        workflows,
        store.query_file("eval_workflow_tokens", {"run_id": eval_arms.run_id}),
        settings=config.paired_settings(),
        others=OtherFigures(world_model_routing(context.instance, pool), probe_ceilings(context.instance, pool)),
        inline_chars=UI_INLINE_MARKDOWN_CHARS,
        fan_out=store.query_file("workflow_fan_out", {"run_id": eval_arms.run_id, "aggregators": aggregators})
        if aggregators else None,
        inner_workflows=store.query_file("eval_inner_workflows", {"run_id": eval_arms.run_id}),
    )

    out_dir = warehouse.artifact_dir("eval_tables")
    for name, frame in results.frames().items():
        write_parquet_atomic(frame, out_dir / f"{eval_arms.run_id}_{name}.parquet", "eval table")
    write_bytes_atomic(out_dir / f"{eval_arms.run_id}_accuracy_vs_cost.png", results.accuracy_png, "eval plot")
    write_bytes_atomic(out_dir / f"{eval_arms.run_id}_running_gap.png", results.gap_png, "eval plot")
    context.log.info(
        f"eval tables for {eval_arms.run_id}: {results.table.height} arms on {results.n_common} common questions"
    )
    return dg.MaterializeResult(
        metadata=eval_tables_metadata(eval_arms, results, out_dir),
        check_results=[conductor_check_result(results.conductor_verdicts)],
    )


EVALUATION_ASSETS = [eval_arms, eval_tables]
EVALUATION_CHECKS = [eval_slice_has_no_leak]
