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
from collections.abc import Sequence

import dagster as dg
from pydantic import Field

from assets.evaluation_inputs import (
    CHECKPOINT_ASSET,
    TrainedPolicy,
    latest_warm_start,
    probe_ceilings,
    questions_seen_in_training,
    routing_world_model,
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
from assets.world_model import WorldModelFitConfig
from conductor_pipeline.conductor.prompt import PromptSpec, read_trained_prompt
from conductor_pipeline.evaluation.arms import EvalRunSummary
from conductor_pipeline.evaluation.comparisons import PairedSettings, comparisons_frame, question_scores
from conductor_pipeline.evaluation.eval_tables import OtherFigures, build_eval_tables
from conductor_pipeline.evaluation.lineup import (
    conductor_twins,
    eval_lineup,
    eval_run_id,
    run_lineup,
    train_split_cascades,
)
from conductor_pipeline.evaluation.routers import choose_best_single
from conductor_pipeline.evaluation.routing_predictions import RoutingPredictions
from conductor_pipeline.evaluation.slices import (
    DEFAULT_SLICE_SIZE,
    assert_no_leak,
    eval_candidates,
    eval_slice,
    find_leaks,
    population,
)
from conductor_pipeline.files import write_bytes_atomic, write_parquet_atomic
from conductor_pipeline.grading.regrade import StaleGradesError, require_current_grades
from conductor_pipeline.pools.backends.base import RecordedWorker
from conductor_pipeline.probing.pass_rates import pass_rate_table
from conductor_pipeline.records import stable_id
from conductor_pipeline.splits import SplitLeakError, split_fingerprint, split_of
from conductor_pipeline.stats import DEFAULT_BOOTSTRAP_RESAMPLES, DEFAULT_CONFIDENCE
from conductor_pipeline.world_model.prompts_and_pruning import prompt_predictor
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource

GROUP = "evaluation"
# Read from the event log when present (`latest_metadata_value`), never required.
WORLD_MODEL_ASSET = "world_model"
# Dagster's UI shows markdown shorter than this inline and hides longer markdown behind a click:
# the verdict lines and the conductor's result must be read without one.
UI_INLINE_MARKDOWN_CHARS = 1000


class EvalArmsConfig(dg.Config):
    """Which questions, how many, how often, and which conductors."""

    corpus: str = Field("math", description="Corpus of the eval slice (math or gsm8k)")
    splits: list[str] = Field(["test"], description="Source splits the slice draws from")
    math_levels: list[int] = Field([5], description="MATH levels (the replay pools record level 5)")
    slice_size: int = Field(DEFAULT_SLICE_SIZE, ge=1, description="Planned slice size: first N eval-split questions")
    order: str = Field(
        "question_id", description="Slice order: question_id (sorted; groups MATH subjects) or hashed (mixed)"
    )
    repeats: int = Field(
        1, ge=1,
        description="Repeats per arm (paper: up to 16); mean and SE (repeats replaying one recording are one sample)",
    )
    only_recorded: bool = Field(
        True, description="Replay pools: draw the slice from questions every replay seat has a recording for"
    )
    random_seed: int = Field(0, description="Seed of the uniformly random router")
    use_conductor_resource: bool = Field(True, description="Evaluate the `conductor` resource's policy")
    include_untrained: bool = Field(
        False,
        description="Also evaluate the `conductor` resource when it is the tiny random-weight default (no "
        "checkpoint, no endpoint): it only proves the path end to end and costs minutes of CPU",
    )
    conductor_checkpoints: list[str] = Field(
        [], description="Extra local HF checkpoints to evaluate as conductor arms"
    )
    checkpoint_temperature: float | None = Field(
        None, ge=0,
        description="Sample the checkpoint arms (configured and trained) at this temperature instead of the one "
        "they trained with (0: greedy); None keeps the trained one. It joins the eval run's id, not the arm names",
    )
    use_trained_checkpoint: bool = Field(
        True, description="Also evaluate the latest materialized conductor_checkpoint, when there is one"
    )
    use_warm_start_policy: bool = Field(
        True,
        description="Also evaluate the latest warm_start_policy model (warm-started, before GRPO), when one was "
        "trained: beside the trained checkpoint it shows what GRPO itself changed",
    )
    shuffled_catalogue: bool = Field(
        True,
        description="Also evaluate each conductor with the pool listed in another order for each question (seeded; "
        "an '@shuffled' arm beside the pool-file order): a conductor that routes by what the catalogue says "
        "scores the same and picks the same workers in both",
    )
    catalogue_seed: int = Field(0, description="Seed of the per-question catalogue orders of '@shuffled' arms")
    include_question: bool = Field(True, description="Show workers the original question next to their subtask")
    max_depth: int = Field(2, ge=0, description="Recursion depth cap when the pool seats the conductor")
    world_model_router: bool = Field(
        True, description="Run the W-router arm: per question, the worker a train-split world model rates highest"
    )
    w_router_lambda_cost: float = Field(
        0.0, ge=0, description="W-router score = P(success) - lambda x predicted cost (USD); 0 ranks on success alone"
    )
    w_cascade: bool = Field(
        True,
        description="Run the W-cascade arm: the cheapest worker (list price) the train-split W trusts enough",
    )
    w_cascade_threshold: float = Field(
        0.5, ge=0, le=1,
        description="W-cascade: predicted success a worker needs to answer; none reaches it -> best single",
    )
    vote_arms: bool = Field(
        True, description="Run broadcast-and-vote arms: every worker (and the best k) answers, the majority answer wins"
    )
    vote_top_k: list[int] = Field(
        [3, 5], description="Also vote over the best k workers of the train split, for each k (2 <= k < pool size)"
    )
    agreement_cascades: bool = Field(
        True,
        description="With the votes, run agreement cascades over the largest best-k vote (ask a few, add the rest "
        "when they disagree), chosen on the train split's probe answers",
    )
    world_model: WorldModelFitConfig = Field(
        default_factory=WorldModelFitConfig,
        description="Knobs of the train-split W that routes the W-router and fills '+W' conductor prompts",
    )


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
    # Conductor seats (recursion) are answered by the orchestrator's conductor policy, not a Worker.
    workers = pool.build_workers([s.name for s in pool_config.workers if not s.is_conductor])
    # Solo arms, routers, the slice and the best single are about seats that answer alone (not a vote).
    seats = [s for s in pool_config.workers if s.name in workers and s.answers_alone]
    solo_workers = {s.name: workers[s.name] for s in seats}
    candidates, restricted = eval_candidates(
        store, solo_workers, corpus=config.corpus, splits=config.splits, math_levels=config.math_levels,
        only_recorded=config.only_recorded,
    )
    chosen = eval_slice([q.question_id for q in candidates], config.slice_size, order=config.order)
    by_id = {q.question_id: q for q in candidates}
    questions = [by_id[qid] for qid in chosen.question_ids]

    calibration = choose_best_single(pass_rate_table(store, pool_config.name), list(solo_workers))
    training_ids = questions_seen_in_training(store, context.instance)
    try:
        assert_no_leak(
            chosen.question_ids, training_ids=training_ids, calibration_ids=calibration.calibration_question_ids
        )
    except SplitLeakError as exc:
        raise dg.Failure(f"train/eval leak before any arm ran: {exc}") from exc

    warm_start = latest_warm_start(context) if config.use_warm_start_policy else None
    checkpoint = trained_policy(context, CHECKPOINT_ASSET, "checkpoint_path") if config.use_trained_checkpoint else None
    trained = [policy for policy in (warm_start, checkpoint) if policy is not None]
    conductors = conductor_resources(config, conductor, trained)
    train_split_w, w_metadata = (
        routing_world_model(warehouse, pool_config.name, seats, config.world_model, chosen.question_ids, context.log)
        if config.world_model_router or config.w_cascade or any(c.show_predicted_success for c in conductors)
        else (None, {})
    )
    predictor = prompt_predictor(train_split_w, pool_config.workers) if train_split_w is not None else None
    routing_predictions = (
        RoutingPredictions.from_model(train_split_w, seats, questions, calibration.worker)
        if train_split_w is not None else None
    )
    # A pool that seats the conductor makes every conductor arm recursive (and labelled so).
    recursive = any(seat.is_conductor for seat in pool_config.workers)
    labels = {c.model_path: c.arm_label for c in conductors if c.model_path}
    conductor_arms = {
        (c.arm_label, order): c.build_arm(
            predictor, recursive=recursive, catalogue_order=order, catalogue_seed=config.catalogue_seed, policy=policy,
        )
        for c in conductors for policy in [c.build_policy(pool_config.vote_seat_names)]
        for order in (("pool", "shuffled") if config.shuffled_catalogue else ("pool",))
    }
    cascades = (
        train_split_cascades(
            store, pool_config.name, calibration, list(solo_workers), config.vote_top_k,
            population=[q.question_id for q in population(
                store, corpus=config.corpus, splits=config.splits, math_levels=config.math_levels)],
        )
        if config.vote_arms and config.agreement_cascades else []
    )
    lineup = eval_lineup(
        seats, calibration, random_seed=config.random_seed,
        world_model=train_split_w if config.world_model_router else None, lambda_cost=config.w_router_lambda_cost,
        conductors=list(conductor_arms.values()),
        cascade_model=train_split_w if config.w_cascade else None, cascade_threshold=config.w_cascade_threshold,
        vote_top_k=config.vote_top_k if config.vote_arms else None,
        agreement_cascades=[choice.arm() for choice in cascades],
    )
    arm_names = lineup.names
    run_id = eval_run_id(
        pool=pool_config.name, corpus=config.corpus, splits=config.splits, math_levels=config.math_levels,
        slice_size=config.slice_size, order=config.order, repeats=config.repeats,
        split_fingerprint=chosen.split_fingerprint, include_question=config.include_question,
        max_depth=config.max_depth, arm_names=arm_names, random_seed=config.random_seed,
        w_router_lambda_cost=config.w_router_lambda_cost,
        arm_inputs=stable_id(
            pool_config.model_dump_json(), calibration.worker,
            routing_predictions.fingerprint() if routing_predictions is not None else None,
            *(c.fingerprint() for c in conductors), *(choice.cascade.describe() for choice in cascades),
        ),
    )
    context.log.info(
        f"eval run {run_id}: {len(questions)} questions (planned {config.slice_size}), {len(arm_names)} arms "
        f"x {config.repeats} repeats; best single on {len(calibration.calibration_question_ids)} "
        f"calibration questions: {calibration.worker}"
    )
    asyncio.run(
        run_lineup(
            store, pool_config, workers, questions, run_id=run_id, lineup=lineup, repeats=config.repeats,
            include_question=config.include_question, max_depth=config.max_depth, log=context.log.info,
        )
    )
    recorded = {name: w for name, w in workers.items() if isinstance(w, RecordedWorker)}
    twins = conductor_twins(
        {key: arm.name for key, arm in conductor_arms.items()},
        trained=labels.get(checkpoint.path) if checkpoint is not None else None,
        warm_start=labels.get(warm_start.path) if warm_start is not None else None,
    )
    summary = EvalRunSummary(
        run_id=run_id, corpus=config.corpus, slice_ids=chosen.question_ids, planned_size=config.slice_size,
        split_fingerprint=chosen.split_fingerprint, repeats=config.repeats, arms=tuple(arm_names),
        best_single_worker=calibration.worker,
        calibration_question_ids=tuple(sorted(calibration.calibration_question_ids)),
        training_question_ids=tuple(training_ids),
        extra={
            "pool": pool_config.name, "restricted_to_recorded": restricted, "order": config.order,
            "aggregators": tuple(seat.name for seat in pool_config.workers if seat.is_vote),
            "w_router_lambda_cost": config.w_router_lambda_cost,
            "world_model_training_question_ids": tuple(sorted(train_split_w.training_question_ids))
            if train_split_w is not None else (),
            "math_levels": tuple(config.math_levels),
            "started_from": twins.started_from,
            "order_twins": twins.order_twins,
            "replayed": len(recorded) == len(workers),
            "single_recording_workers": tuple(sorted(n for n, w in recorded.items() if w.samples_recorded == 1)),
            "routing_predictions": routing_predictions,
            # How many workers each cascade asks before it may stop, and the vote it stops early
            # (eval_tables counts its escalations and pairs it with that vote).
            "cascade_first_stage": {choice.arm().name: len(choice.cascade.first) for choice in cascades},
            "cascade_votes": {choice.arm().name: choice.vote for choice in cascades},
        },
    )
    return dg.Output(summary, metadata=eval_arms_metadata(summary, calibration, cascades, conductors, w_metadata))


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


class EvalTablesConfig(dg.Config):
    """How the paired intervals are formed."""

    n_bootstrap: int = Field(
        DEFAULT_BOOTSTRAP_RESAMPLES, ge=100, description="Question resamples of every paired bootstrap interval"
    )
    confidence: float = Field(DEFAULT_CONFIDENCE, gt=0, lt=1, description="Coverage of every interval")
    seed: int = Field(0, description="Seed of the question resamples (one seed pairs every interval)")

    def paired_settings(self) -> PairedSettings:
        return PairedSettings(confidence=self.confidence, n_resamples=self.n_bootstrap, seed=self.seed)


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
    tables = {"arms": results.table, "running_gap": results.gap, "paired": comparisons_frame(results.comparisons),
              # each arm's score per question: what pools this run with other seeds' (assets/seeds.py)
              "question_scores": question_scores(workflows)}
    if results.recursion is not None:
        tables["recursion"] = results.recursion
    for name, frame in (("conductor_pairs", results.conductor_pairs), ("positions", results.positions),
                        ("order_agreement", results.order_agreement)):
        if frame is not None:
            tables[name] = frame
    if results.sweep.height:
        tables["cost_sweep"] = results.sweep
    for name, frame in tables.items():
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
