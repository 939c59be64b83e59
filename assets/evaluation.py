"""Evaluation assets: every worker solo, the baselines and each conductor on a fixed eval slice.

`eval_arms` runs the arms through the orchestrator (rows land in `calls` and `workflows` under
one evaluation run id, resumable: a rerun skips recorded workflows); `eval_tables` turns those
rows into the arm table, usage shares, parse codes, the running gap and the gap decomposition.
A blocking check fails when a question used for training or for choosing the best single
worker appears in the eval slice, or when the world model that routes (the W-router arm) or
fills conductor prompts saw an eval-split question: that W is fitted here, on the warehouse's
scored rows of TRAIN-split questions for this pool's workers (LightGBM on a few thousand rows,
seconds), not loaded from the `world_model` asset, whose W saw every question.

The default conductor is the tiny offline HF model (random weights, CPU): it is here to prove
the path end to end and is shown as the weak arm it is; configure a checkpoint or an endpoint
on the `conductor` resource for a real result.
"""

# No `from __future__ import annotations`: Dagster reads the config parameter's annotation as a class.
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import dagster as dg
import polars as pl
from pydantic import Field

from assets.metadata import latest_metadata, png_markdown
from assets.probing import pass_rates
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.evaluation.arms import ConductorArm, EvalRunSummary, RouterArm, SoloArm, run_arm
from conductor_pipeline.evaluation.routers import (
    BestSingleChoice,
    BestSingleRouter,
    OracleRouter,
    RandomRouter,
    WorldModelRouter,
    choose_best_single,
    solo_verdicts,
)
from conductor_pipeline.evaluation.slices import DEFAULT_SLICE_SIZE, eval_slice, find_leaks
from conductor_pipeline.evaluation.tables import (
    arm_table,
    common_questions,
    decompose_gap,
    decomposition_inputs,
    markdown_table,
    parse_code_histogram,
    routing_value,
    running_gap,
    worker_usage,
)
from conductor_pipeline.plots import accuracy_cost_plot, running_gap_plot
from conductor_pipeline.pools.config import PoolConfig
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.probing.pass_rates import pass_rate_table
from conductor_pipeline.probing.runner import select_questions
from conductor_pipeline.records import Question, stable_id
from conductor_pipeline.splits import split_fingerprint, split_of
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.data import load_training_frame
from conductor_pipeline.world_model.features import WorldModelSettings
from conductor_pipeline.world_model.hooks import prompt_predictor
from conductor_pipeline.world_model.model import WorldModel, fit_on_train_split
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource

GROUP = "evaluation"
# Column headers a reader sees in the arm table (units in the header, not in a code name).
ARM_TABLE_HEADERS = {
    "arm": "arm", "n_label": "n", "repeats": "repeats", "accuracy": "accuracy", "se": "SE",
    "ci_low": "95% CI low", "ci_high": "95% CI high", "cost_per_question": "cost / question (USD)",
    "latency_per_question_s": "latency / question (s)", "tokens_per_question": "tokens / question",
    "mean_steps": "steps / workflow", "parse_ok_share": "parsed share",
}
# Read from the event log when present (see `_latest_metadata`), never required.
CHECKPOINT_ASSET = "conductor_checkpoint"
CONTESTED_SET_ASSET = "contested_set"
# Every evaluation run id starts with this, so training-question queries can tell runs apart.
EVAL_RUN_PREFIX = "eval-"
W_ROUTER_ARM = "w_router"
# Where the train-split W of a pool is saved (next to the `world_model` asset's all-data W).
TRAIN_SPLIT_W_SUFFIX = "-train-split.pkl"


class EvalArmsConfig(dg.Config):
    """Which questions, how many, how often, and which conductors."""

    corpus: str = Field("math", description="Corpus of the eval slice (math or gsm8k)")
    splits: list[str] = Field(["test"], description="Source splits the slice draws from")
    math_levels: list[int] = Field([5], description="MATH levels (the replay pools record level 5)")
    slice_size: int = Field(DEFAULT_SLICE_SIZE, ge=1, description="Planned slice size: first N eval-split questions")
    order: str = Field(
        "question_id", description="Slice order: question_id (sorted; groups MATH subjects) or hashed (mixed)"
    )
    repeats: int = Field(1, ge=1, description="Repeats per arm (paper: up to 16); reported as mean and SE")
    only_recorded: bool = Field(
        True, description="Replay pools: draw the slice from questions every replay seat has a recording for"
    )
    random_seed: int = Field(0, description="Seed of the uniformly random router")
    use_conductor_resource: bool = Field(True, description="Evaluate the `conductor` resource's policy")
    conductor_checkpoints: list[str] = Field(
        [], description="Extra local HF checkpoints to evaluate as conductor arms"
    )
    use_trained_checkpoint: bool = Field(
        True, description="Also evaluate the latest materialized conductor_checkpoint, when there is one"
    )
    include_question: bool = Field(True, description="Show workers the original question next to their subtask")
    max_depth: int = Field(2, ge=0, description="Recursion depth cap when the pool seats the conductor")
    world_model_router: bool = Field(
        True, description="Run the W-router arm: per question, the worker a train-split world model rates highest"
    )
    w_router_lambda_cost: float = Field(
        0.0, ge=0, description="W-router score = P(success) - lambda x predicted cost (USD); 0 ranks on success alone"
    )
    world_model_threads: int = Field(2, ge=1, description="LightGBM threads for fitting the train-split W")


def _eval_questions(store: Warehouse, config: EvalArmsConfig, workers: dict) -> tuple[list[Question], bool]:
    """Candidate questions; restricted to what every replay seat recorded when asked (and possible)."""
    questions = select_questions(
        store, corpora=[config.corpus], splits=config.splits, math_levels=config.math_levels, limit=None
    )
    coverages = [getattr(w, "question_ids", None) for w in workers.values()]
    if config.only_recorded and coverages and all(c is not None for c in coverages):
        covered = frozenset.intersection(*map(frozenset, coverages))
        return [q for q in questions if q.question_id in covered], True
    return questions, False


def _latest_metadata(instance: dg.DagsterInstance, asset: str, field: str) -> object | None:
    """A metadata value of an asset's latest materialization, or None (never materialized here).

    Read from the event log rather than as an asset dependency: evaluation must not wait for (or
    be blocked by) a training run that the gates may rightly refuse.
    """
    entry = (latest_metadata(instance, asset) or {}).get(field)
    return None if entry is None else entry.value


def _training_question_ids(store: Warehouse, instance: dg.DagsterInstance) -> list[str]:
    """Every question a conductor was trained or run on outside evaluation: conductor calls logged
    outside eval runs, plus the latest contested set (the GRPO training questions), if any."""
    ids = set(store.query_file("eval_training_questions", {"eval_prefix": EVAL_RUN_PREFIX})["question_id"].to_list())
    manifest_path = _latest_metadata(instance, CONTESTED_SET_ASSET, "manifest_path")
    if manifest_path and Path(str(manifest_path)).is_file():
        ids.update(json.loads(Path(str(manifest_path)).read_text()).get("question_ids", []))
    return sorted(ids)


def _conductor_resources(
    config: EvalArmsConfig, conductor: ConductorPolicyResource, trained_checkpoint: str | None
) -> list[ConductorPolicyResource]:
    chosen = [conductor] if config.use_conductor_resource else []
    paths = list(config.conductor_checkpoints)
    if trained_checkpoint and trained_checkpoint not in paths:
        paths.append(trained_checkpoint)
    for path in paths:
        chosen.append(
            ConductorPolicyResource(
                kind="hf_local", model_path=path, device=conductor.device, naming=conductor.naming,
                n_examples=conductor.n_examples, temperature=conductor.temperature,
                max_new_tokens=conductor.max_new_tokens, show_predicted_success=conductor.show_predicted_success,
            )
        )
    return chosen


async def _run_all_arms(
    context: dg.AssetExecutionContext,
    store: Warehouse,
    pool_config: PoolConfig,
    workers: dict,
    questions: Sequence[Question],
    *,
    run_id: str,
    config: EvalArmsConfig,
    calibration: BestSingleChoice,
    conductors: Sequence[ConductorPolicyResource],
    train_split_w: WorldModel | None,
) -> None:
    policies = [(c, c.build_policy()) for c in conductors]
    # A pool that seats the conductor recurses with the first configured policy.
    recursion_policy = policies[0][1] if policies else None
    recursion_settings = policies[0][0] if policies else None
    predictor = prompt_predictor(train_split_w, pool_config.workers) if train_split_w is not None else None
    orchestrator = Orchestrator(
        pool_config, workers, Governor.from_pool(pool_config), store,
        include_question=config.include_question, max_depth=config.max_depth,
        naming=recursion_settings.naming if recursion_settings else "ordinal",
        conductor_policy=recursion_policy,
        conductor_temperature=recursion_settings.temperature if recursion_settings else 1.0,
        conductor_max_new_tokens=recursion_settings.effective_max_new_tokens if recursion_settings else 1024,
        predicted_success=predictor if recursion_settings and recursion_settings.show_predicted_success else None,
    )
    done = frozenset(store.query_file("eval_workflows", {"run_id": run_id})["workflow_id"].to_list())

    async def run(arm) -> None:
        records = await run_arm(
            orchestrator, arm, questions, run_id=run_id, repeats=config.repeats, skip_workflow_ids=done
        )
        context.log.info(f"{arm.name}: {len(records)} workflows run ({len(questions)} questions x {config.repeats})")

    try:
        seated = [name for name in pool_config.worker_names if name in workers]
        await asyncio.gather(*(run(SoloArm(worker)) for worker in seated))
        solo = store.query_file("eval_workflows", {"run_id": run_id}).filter(pl.col("arm").str.starts_with("solo:"))
        verdict_rows = solo.select("question_id", pl.col("workers").list.first().alias("worker"), "correct")
        routers = [
            BestSingleRouter(calibration),
            RandomRouter(tuple(seated), seed=config.random_seed),
            OracleRouter(solo_verdicts(verdict_rows.iter_rows(named=True)), fallback=calibration.worker),
        ]
        if config.world_model_router and train_split_w is not None:
            seats = tuple(s for s in pool_config.workers if s.name in seated)
            routers.append(WorldModelRouter(train_split_w, seats, lambda_cost=config.w_router_lambda_cost))
        await asyncio.gather(*(run(RouterArm(router)) for router in routers))
        for settings, policy in policies:
            await run(
                ConductorArm(
                    settings.arm_label, policy, naming=settings.naming, examples=settings.examples(),
                    temperature=settings.temperature, max_new_tokens=settings.effective_max_new_tokens,
                    predicted_success=predictor if settings.show_predicted_success else None,
                )
            )
    finally:
        await orchestrator.aclose()
        for _, policy in policies:
            await policy.aclose()
        for worker in workers.values():
            await worker.aclose()


def train_split_world_model_path(warehouse: WarehouseResource, pool_name: str) -> Path:
    """Where eval_arms saves the pool's train-split W (the training path can load it from here)."""
    return warehouse.artifact_dir("world_model") / f"{pool_name}{TRAIN_SPLIT_W_SUFFIX}"


def fit_train_split_world_model(
    store: Warehouse, pool_config: PoolConfig, workers: Sequence[str], *, num_threads: int = 2
) -> WorldModel:
    """W on the warehouse's scored rows of train-split questions for these workers of the pool."""
    seats = {s.name: s for s in pool_config.workers if s.name in set(workers)}
    return fit_on_train_split(load_training_frame(store), seats, WorldModelSettings(num_threads=num_threads))


@dg.asset(group_name=GROUP, deps=[pass_rates], kinds={"duckdb", "lightgbm"})
def eval_arms(
    context: dg.AssetExecutionContext,
    config: EvalArmsConfig,
    warehouse: WarehouseResource,
    pool: PoolResource,
    conductor: ConductorPolicyResource,
) -> dg.Output[EvalRunSummary]:
    """Every worker solo, best-single / random / oracle routers and each conductor on the eval slice."""
    pool_config = pool.load()
    store = warehouse.get_warehouse()
    # Conductor seats (recursion) are answered by the orchestrator's conductor policy, not a Worker.
    workers = pool.build_workers([s.name for s in pool_config.workers if s.backend != "conductor"])
    candidates, restricted = _eval_questions(store, config, workers)
    chosen = eval_slice([q.question_id for q in candidates], config.slice_size, order=config.order)
    by_id = {q.question_id: q for q in candidates}
    questions = [by_id[qid] for qid in chosen.question_ids]

    calibration = choose_best_single(pass_rate_table(store, pool_config.name), list(workers))
    training_ids = _training_question_ids(store, context.instance)
    leaks = find_leaks(
        chosen.question_ids, training_ids=training_ids, calibration_ids=calibration.calibration_question_ids
    )
    if any(leaks.values()):
        raise dg.Failure(f"train/eval leak before any arm ran: { {k: v[:5] for k, v in leaks.items() if v} }")

    trained = _latest_metadata(context.instance, CHECKPOINT_ASSET, "checkpoint_path") if config.use_trained_checkpoint else None
    if trained is not None and not Path(str(trained)).exists():
        context.log.warning(f"latest conductor_checkpoint {trained} is gone; not evaluated")
        trained = None
    conductors = _conductor_resources(config, conductor, str(trained) if trained else None)
    train_split_w: WorldModel | None = None
    w_metadata: dict[str, object] = {}
    if config.world_model_router or any(c.show_predicted_success for c in conductors):
        train_split_w = fit_train_split_world_model(
            store, pool_config, list(workers), num_threads=config.world_model_threads
        )
        w_ids = sorted(train_split_w.training_question_ids)
        on_eval_side = [qid for qid in w_ids if split_of(qid) != "train"]
        leaked = sorted(set(w_ids) & set(chosen.question_ids))
        if on_eval_side or leaked:
            raise dg.Failure(f"the routing W saw eval questions: {(on_eval_side or leaked)[:5]}")
        w_path = train_split_w.save(train_split_world_model_path(warehouse, pool_config.name))
        w_metadata = {
            "world_model_path": dg.MetadataValue.path(str(w_path)),
            "world_model_training_questions": len(w_ids),
            "world_model_training_rows": train_split_w.training_summary["rows"],
        }
        context.log.info(f"train-split W: {len(w_ids)} questions, {train_split_w.training_summary['rows']} rows")
    arm_names = (
        [f"solo:{w}" for w in workers] + ["best_single", "random", "oracle"]
        + ([W_ROUTER_ARM] if config.world_model_router else [])
        + [f"conductor:{c.arm_label}" for c in conductors]
    )
    run_id = EVAL_RUN_PREFIX + stable_id(
        pool_config.name, config.corpus, config.splits, config.math_levels, config.slice_size, config.order,
        config.repeats, chosen.split_fingerprint, config.include_question, config.max_depth, arm_names,
        config.random_seed, config.w_router_lambda_cost,
    )
    context.log.info(
        f"eval run {run_id}: {len(questions)} questions (planned {config.slice_size}), {len(arm_names)} arms "
        f"x {config.repeats} repeats; best single on {len(calibration.calibration_question_ids)} "
        f"calibration questions: {calibration.worker}"
    )
    asyncio.run(
        _run_all_arms(
            context, store, pool_config, workers, questions, run_id=run_id, config=config,
            calibration=calibration, conductors=conductors, train_split_w=train_split_w,
        )
    )
    summary = EvalRunSummary(
        run_id=run_id, corpus=config.corpus, slice_ids=chosen.question_ids, planned_size=config.slice_size,
        split_fingerprint=chosen.split_fingerprint, repeats=config.repeats, arms=tuple(arm_names),
        best_single_worker=calibration.worker,
        calibration_question_ids=tuple(sorted(calibration.calibration_question_ids)),
        training_question_ids=tuple(training_ids),
        extra={
            "pool": pool_config.name, "restricted_to_recorded": restricted, "order": config.order,
            "w_router_lambda_cost": config.w_router_lambda_cost,
            "world_model_training_question_ids": tuple(sorted(train_split_w.training_question_ids))
            if train_split_w is not None else (),
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
    leaks = find_leaks(
        evaluated,
        training_ids=set(eval_arms.training_question_ids) | set(_training_question_ids(store, context.instance)) | set(w_ids),
        calibration_ids=eval_arms.calibration_question_ids,
    )
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


def decomposition_markdown(decompositions: Sequence[dict]) -> str:
    """One row per quantity, one column per conductor arm: fourteen columns side by side were cut off in the UI."""
    metrics = [key for key in decompositions[0] if key != "arm"]
    frame = pl.DataFrame(
        {"quantity": metrics, **{d["arm"]: [_cell(d.get(m)) for m in metrics] for d in decompositions}}
    )
    return markdown_table(frame)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _routing_metadata(routing: dict | None) -> dict[str, dg.MetadataValue]:
    """The W-router beside best single and oracle, and the share of the oracle headroom it recovers."""
    if routing is None:
        return {"routing_value": dg.MetadataValue.md("no W-router arm in this run")}
    share = routing["headroom_recovered"]
    rows = pl.DataFrame(
        {
            "questions": [routing["n"]],
            "best single (calibration-chosen)": [routing["best_single"]],
            "W-router": [routing["accuracy"]],
            "oracle": [routing["oracle"]],
            "oracle headroom recovered": [share],  # empty cell: the oracle has no headroom
        },
        schema_overrides={"oracle headroom recovered": pl.Float64},
    )
    metadata = {
        "routing_value": dg.MetadataValue.md(markdown_table(rows)),
        "w_router_accuracy": dg.MetadataValue.float(routing["accuracy"]),
    }
    if share is not None:  # no headroom (oracle = best single): no share to report
        metadata["w_router_headroom_recovered"] = dg.MetadataValue.float(share)
    return metadata


@dg.asset(group_name=GROUP, kinds={"duckdb"})
def eval_tables(
    context: dg.AssetExecutionContext, eval_arms: EvalRunSummary, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Arm table (accuracy with 95% intervals, cost, latency, tokens, steps), usage, parse codes,
    the running gap and the decomposition of each conductor's gap to the best single worker."""
    store = warehouse.get_warehouse()
    workflows = store.query_file("eval_workflows", {"run_id": eval_arms.run_id})
    if workflows.is_empty():
        raise dg.Failure(f"no workflows recorded for eval run {eval_arms.run_id}: materialize eval_arms first")
    tokens = store.query_file("eval_workflow_tokens", {"run_id": eval_arms.run_id})
    order = list(eval_arms.slice_ids)
    table = arm_table(
        workflows,
        planned_size=eval_arms.planned_size,
        call_tokens=tokens,
        slice_order=order,
        available=len(eval_arms.slice_ids),
    )
    gap = running_gap(workflows, slice_order=order)
    common = common_questions(workflows)
    routing = routing_value(table, W_ROUTER_ARM)
    decompositions = []
    for arm in sorted(a for a in workflows["arm"].unique().to_list() if a.startswith("conductor:")):
        solo, conductor_rows = decomposition_inputs(workflows, arm, common)
        if solo.height and conductor_rows.height:
            context_row = {W_ROUTER_ARM: routing["accuracy"]} if routing else {}
            decompositions.append({"arm": arm, **decompose_gap(solo, conductor_rows), **context_row})

    out_dir = warehouse.artifact_dir("eval_tables")
    table.write_parquet(out_dir / f"{eval_arms.run_id}_arms.parquet")
    gap.write_parquet(out_dir / f"{eval_arms.run_id}_running_gap.parquet")
    accuracy_png = accuracy_cost_plot(table)
    gap_png = running_gap_plot(gap)
    (out_dir / f"{eval_arms.run_id}_accuracy_vs_cost.png").write_bytes(accuracy_png)
    (out_dir / f"{eval_arms.run_id}_running_gap.png").write_bytes(gap_png)
    arm_columns = list(ARM_TABLE_HEADERS)
    if table.height and table["n_label"].n_unique() == 1:
        arm_columns.remove("n_label")  # the same for every arm: shown once, as the `n_label` entry
    context.log.info(f"eval tables for {eval_arms.run_id}: {table.height} arms on {len(common)} common questions")
    return dg.MaterializeResult(
        metadata={
            "run_id": eval_arms.run_id,
            "n_scored": len(common),
            "planned_slice_size": eval_arms.planned_size,
            "n_label": table["n_label"][0] if table.height else "n=0",
            "split_fingerprint": eval_arms.split_fingerprint,
            "arm_table": dg.MetadataValue.md(
                markdown_table(table.select(arm_columns).rename(ARM_TABLE_HEADERS, strict=False))
            ),
            "worker_usage": dg.MetadataValue.md(markdown_table(worker_usage(workflows))),
            "parse_codes": dg.MetadataValue.md(markdown_table(parse_code_histogram(workflows))),
            "running_gap": dg.MetadataValue.md(markdown_table(gap) if gap.height else "fewer than 50 common questions"),
            "decomposition": dg.MetadataValue.md(
                decomposition_markdown(decompositions) if decompositions else "no conductor arm"
            ),
            **_routing_metadata(routing),
            "accuracy_vs_cost_plot": png_markdown(accuracy_png, "accuracy vs cost per arm"),
            "running_gap_plot": png_markdown(gap_png, "running gap to the best single worker"),
            "tables_dir": dg.MetadataValue.path(str(out_dir)),
        }
    )


EVALUATION_ASSETS = [eval_arms, eval_tables]
EVALUATION_CHECKS = [eval_slice_has_no_leak]
