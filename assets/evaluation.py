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
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from pydantic import Field

from assets.deployment import SEED_TAG
from assets.metadata import latest_metadata, latest_metadata_value, png_markdown, stage
from assets.probing import pass_rates
from assets.world_model import WorldModelFitConfig, train_split_world_model_path
from conductor_pipeline.conductor.prompt import PromptSpec, read_trained_prompt
from conductor_pipeline.evaluation.arms import EvalRunSummary
from conductor_pipeline.evaluation.comparisons import PairedSettings, comparisons_frame, question_scores
from conductor_pipeline.evaluation.eval_tables import OtherFigures, build_eval_tables
from conductor_pipeline.evaluation.lineup import eval_lineup, eval_run_id, run_lineup, train_split_cascades
from conductor_pipeline.evaluation.routers import choose_best_single
from conductor_pipeline.evaluation.routing_predictions import RoutingPredictions
from conductor_pipeline.evaluation.slices import (
    DEFAULT_SLICE_SIZE,
    assert_no_leak,
    eval_candidates,
    eval_slice,
    find_leaks,
    population,
    training_question_ids,
)
from conductor_pipeline.files import write_bytes_atomic, write_parquet_atomic
from conductor_pipeline.grading.regrade import StaleGradesError, require_current_grades
from conductor_pipeline.pools.backends.base import RecordedWorker
from conductor_pipeline.probing.pass_rates import pass_rate_table
from conductor_pipeline.records import stable_id
from conductor_pipeline.splits import SplitLeakError, split_fingerprint, split_of
from conductor_pipeline.stats import DEFAULT_BOOTSTRAP_RESAMPLES, DEFAULT_CONFIDENCE
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.model import WorldModel, fit_train_split_world_model
from conductor_pipeline.world_model.persistence import save_world_model
from conductor_pipeline.world_model.prompts_and_pruning import prompt_predictor
from resources.conductor import TRAINED_PROMPT_FIELDS, ConductorPolicyResource
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource

GROUP = "evaluation"
# Read from the event log when present (`latest_metadata_value`), never required.
CHECKPOINT_ASSET = "conductor_checkpoint"
WARM_START_ASSET = "warm_start_policy"
CONTESTED_SET_ASSET = "contested_set"
WORLD_MODEL_ASSET = "world_model"
WORLD_MODEL_REPORT_ASSET = "world_model_report"
CEILINGS_ASSET = "oracle_ceilings"
CONDUCTOR_CHECK = "conductor_beats_best_single"
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


def questions_seen_in_training(store: Warehouse, instance: dg.DagsterInstance) -> list[str]:
    """Every question a conductor was trained or run on outside evaluation, with the latest
    contested set's. Read from the event log rather than as an asset dependency: evaluation must
    not wait for (or be blocked by) a training run that the gates may rightly refuse."""
    return training_question_ids(store, latest_metadata_value(instance, CONTESTED_SET_ASSET, "manifest_path"))


@dataclass(frozen=True)
class TrainedPolicy:
    """A model a training asset wrote, with the prompt and sampling it was trained under (None
    for a materialization from before the training assets recorded it)."""

    path: str
    prompt: PromptSpec | None


def _conductor_resources(
    config: EvalArmsConfig, conductor: ConductorPolicyResource, trained: Sequence[TrainedPolicy]
) -> list[ConductorPolicyResource]:
    """The conductor resource (unless it is the untrained default), the configured checkpoints
    (prompted as they were trained when their folder records it, `read_trained_prompt`, else like
    the resource) and the trained policies (prompted as they were trained)."""
    chosen = [conductor] if config.use_conductor_resource and (config.include_untrained or not conductor.untrained) else []
    paths = list(dict.fromkeys(config.conductor_checkpoints))
    chosen += [conductor.with_checkpoint(path, read_trained_prompt(path)) for path in paths]
    for policy in trained:
        if policy.path not in paths:
            paths.append(policy.path)
            chosen.append(conductor.with_checkpoint(policy.path, policy.prompt))
    return chosen


def _trained_policy(context: dg.AssetExecutionContext, asset: str, path_field: str) -> TrainedPolicy | None:
    """The model of `asset`'s latest materialization (its `path_field`), while it is on disk and was
    trained with this run's seed: after a seed whose gate closed, the latest checkpoint is another
    seed's, and evaluating it under this seed would count one conductor twice."""
    instance = context.instance
    path = latest_metadata_value(instance, asset, path_field)
    if path is None:
        return None
    seed = context.run.tags.get(SEED_TAG)
    event = instance.get_latest_materialization_event(dg.AssetKey(asset))
    trained_with = event and instance.get_run_by_id(event.run_id)
    trained_seed = trained_with.tags.get(SEED_TAG) if trained_with else None
    if seed is not None and trained_seed is not None and trained_seed != seed:
        context.log.warning(f"latest {asset} model {path} was trained with seed {trained_seed}, this run is seed {seed}; "
                            "not evaluated")
        return None
    if not Path(str(path)).exists():
        context.log.warning(f"latest {asset} model {path} is gone; not evaluated")
        return None
    prompt = latest_metadata_value(instance, asset, "prompt")
    if prompt is None:
        context.log.warning(f"latest {asset} recorded no training prompt; {path} is prompted like the conductor resource")
    return TrainedPolicy(str(path), PromptSpec.model_validate(prompt) if isinstance(prompt, Mapping) else None)


def _latest_warm_start(context: dg.AssetExecutionContext) -> TrainedPolicy | None:
    """The latest warm-started model, when the warm start trained one (not the base policy it
    passes on when disabled) and it is still on disk."""
    if latest_metadata_value(context.instance, WARM_START_ASSET, "warm_start") is not True:
        return None
    return _trained_policy(context, WARM_START_ASSET, "model_path")


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

    warm_start = _latest_warm_start(context) if config.use_warm_start_policy else None
    checkpoint = _trained_policy(context, CHECKPOINT_ASSET, "checkpoint_path") if config.use_trained_checkpoint else None
    trained = [policy for policy in (warm_start, checkpoint) if policy is not None]
    conductors = _conductor_resources(config, conductor, trained)
    train_split_w: WorldModel | None = None
    w_metadata: dict[str, object] = {}
    if config.world_model_router or config.w_cascade or any(c.show_predicted_success for c in conductors):
        train_split_w = fit_train_split_world_model(store, seats, config.world_model.model_settings())
        w_ids = sorted(train_split_w.training_question_ids)
        on_eval_side = [qid for qid in w_ids if split_of(qid) != "train"]
        leaked = sorted(set(w_ids) & set(chosen.question_ids))
        if on_eval_side or leaked:
            raise dg.Failure(f"the routing W saw eval questions: {(on_eval_side or leaked)[:5]}")
        w_path = save_world_model(train_split_w, train_split_world_model_path(warehouse, pool_config.name))
        w_metadata = {
            "world_model_path": dg.MetadataValue.path(str(w_path)),
            "world_model_training_questions": len(w_ids),
            "world_model_training_rows": train_split_w.training_summary["rows"],
        }
        context.log.info(f"train-split W: {len(w_ids)} questions, {train_split_w.training_summary['rows']} rows")
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
            # Each trained conductor arm beside the warm-started one it was trained from, and each
            # pool-order arm beside the same policy with the catalogue shuffled (eval_tables pairs them).
            "started_from": {
                arm.name: conductor_arms[(labels[warm_start.path], order)].name
                for (label, order), arm in conductor_arms.items()
                if checkpoint is not None and warm_start is not None and label == labels.get(checkpoint.path)
                and (labels.get(warm_start.path), order) in conductor_arms
            },
            "order_twins": {
                arm.name: conductor_arms[(label, "shuffled")].name
                for (label, order), arm in conductor_arms.items() if order == "pool" and (label, "shuffled") in conductor_arms
            },
            "replayed": len(recorded) == len(workers),
            "single_recording_workers": tuple(sorted(n for n, w in recorded.items() if w.samples_recorded == 1)),
            "routing_predictions": routing_predictions,
            # How many workers each cascade asks before it may stop, and the vote it stops early
            # (eval_tables counts its escalations and pairs it with that vote).
            "cascade_first_stage": {choice.arm().name: len(choice.cascade.first) for choice in cascades},
            "cascade_votes": {choice.arm().name: choice.vote for choice in cascades},
        },
    )
    return dg.Output(
        summary,
        metadata={
            "run_id": run_id,
            "pool": pool_config.name,
            "planned_slice_size": config.slice_size,
            "slice_size": len(questions),
            "slice_order": config.order,
            "restricted_to_recorded": restricted,
            "split_fingerprint": chosen.split_fingerprint,
            "repeats": config.repeats,
            "arms": dg.MetadataValue.json(arm_names),
            "best_single_worker": calibration.worker,
            "calibration_questions": len(calibration.calibration_question_ids),
            "calibration_accuracies": dg.MetadataValue.json(calibration.accuracies),
            "agreement_cascades": dg.MetadataValue.json([choice.metadata() for choice in cascades]),
            "conductor_prompts": dg.MetadataValue.json({
                c.arm_label: {
                    "model": c.model_path or c.model, **{f: getattr(c, f) for f in TRAINED_PROMPT_FIELDS},
                    "max_new_tokens": c.effective_max_new_tokens,
                }
                for c in conductors
            }),
            **w_metadata,
        },
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


class EvalTablesConfig(dg.Config):
    """How the paired intervals are formed."""

    n_bootstrap: int = Field(
        DEFAULT_BOOTSTRAP_RESAMPLES, ge=100, description="Question resamples of every paired bootstrap interval"
    )
    confidence: float = Field(DEFAULT_CONFIDENCE, gt=0, lt=1, description="Coverage of every interval")
    seed: int = Field(0, description="Seed of the question resamples (one seed pairs every interval)")

    def paired_settings(self) -> PairedSettings:
        return PairedSettings(confidence=self.confidence, n_resamples=self.n_bootstrap, seed=self.seed)


def _routing_metadata(routing: dict | None) -> dict[str, dg.MetadataValue]:
    """The W-router's accuracy and the share of the oracle headroom it recovers, as numbers."""
    if routing is None:
        return {}
    metadata = {"w_router_accuracy": dg.MetadataValue.float(round(routing["accuracy"], 4))}
    if routing["headroom_recovered"] is not None:  # no headroom (oracle = best single): no share to report
        metadata["w_router_headroom_recovered"] = dg.MetadataValue.float(round(routing["headroom_recovered"], 4))
    return metadata


def world_model_routing(instance: dg.DagsterInstance, pool: str) -> Mapping[str, object] | None:
    """The latest `world_model_report`'s cross-validated routing figures for `pool`
    (`routing_figures[<pool>]`: questions, population, accuracies, headroom recovered with its
    interval), or None when the report has not routed this pool."""
    entry = (latest_metadata(instance, WORLD_MODEL_REPORT_ASSET) or {}).get(f"routing_figures[{pool}]")
    return None if entry is None else dict(entry.value)


def probe_ceilings(instance: dg.DagsterInstance, pool: str) -> dict[str, object] | None:
    """The latest `oracle_ceilings` figures (questions, best single, oracle) when they are this pool's."""
    metadata = latest_metadata(instance, CEILINGS_ASSET) or {}
    if "pool" not in metadata or metadata["pool"].value != pool:
        return None
    return {key: metadata[key].value for key in ("n_questions", "best_single", "oracle") if key in metadata}


def conductor_check_result(verdicts: dict[str, str]) -> dg.AssetCheckResult:
    """Passes when a conductor arm beats the best single worker by the paired interval; a warning."""
    phrase = {"beats": "beats", "ties": "ties with", "loses": "loses to"}
    if not verdicts:
        description = "no conductor arm was evaluated"
    else:
        description = "; ".join(f"{arm} {phrase.get(v, v)} the best single worker" for arm, v in verdicts.items())
    return dg.AssetCheckResult(
        check_name=CONDUCTOR_CHECK,
        passed=any(verdict == "beats" for verdict in verdicts.values()),
        severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata={"verdicts": dg.MetadataValue.json(verdicts)},
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
        metadata={
            "run_id": eval_arms.run_id,
            "n_scored": results.n_common,
            "planned_slice_size": eval_arms.planned_size,
            "n_label": results.table["n_label"][0] if results.table.height else "n=0",
            "split_fingerprint": eval_arms.split_fingerprint,
            **{key: dg.MetadataValue.md(text) for key, text in results.markdown.items()},
            **_routing_metadata(results.routing),
            "accuracy_vs_cost_plot": png_markdown(results.accuracy_png, "accuracy vs cost per arm"),
            "running_gap_plot": png_markdown(results.gap_png, "running gap to the best single worker"),
            "tables_dir": dg.MetadataValue.path(str(out_dir)),
        },
        check_results=[conductor_check_result(results.conductor_verdicts)],
    )


EVALUATION_ASSETS = [eval_arms, eval_tables]
EVALUATION_CHECKS = [eval_slice_has_no_leak]
