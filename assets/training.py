"""Training assets: the contested set, the warm start, the zero-variance probe and its gate, GRPO.

The chain decides whether a GPU-hour is aimed at a validated target:

    pass_rates -> contested_set [blocking check: size]
               -> warm_start_policy (SFT on synthetic valid workflows)
               -> grpo_probe_run (short GRPO) [blocking check: zero_variance_gate]
               -> conductor_checkpoint (GRPO, checkpoints, resumable)

Only the *train* split (`conductor_pipeline.splits`) enters the contested set, and so the probe
and training. Rollouts are parsed and executed against the pool through the orchestrator
(replay pools make this free). A failed blocking check stops training in the same run; in later
runs `conductor_checkpoint` reads the persisted gate verdict and refuses unless it passed on the
latest probe run. Training steps run in the Dagster concurrency pool `gpu` (one at a time).

(No `from __future__ import annotations`: Dagster checks the `context` annotation as a class.)
"""

import time

import dagster as dg
from pydantic import Field

from assets.deployment import GPU_POOL  # training, probe and warm start share one GPU: one step at a time
from assets.metadata import stage
from assets.probing import pass_rates
from assets.training_metadata import (
    StageRun,
    checkpoint_metadata,
    contested_metadata,
    parse_check_metadata,
    probe_metadata,
    telemetry_metadata,
    warm_start_metadata,
)
from assets.training_wiring import (
    contested_dir,
    failing_step,
    grpo_executor_for,
    grpo_run,
    observe_progress,
    prompt_metadata,
    recipe_of,
    repeatable_run_id,
    rollout_executor,
    training_device,
    training_set,
)
from conductor_pipeline.evaluation.learning import choice_balance
from conductor_pipeline.probing.contested import BAND_HIGH, BAND_LOW, ContestedRule
from conductor_pipeline.training.dataset import (
    choose_contested_set,
    read_contested_manifest,
    write_contested_set,
)
from conductor_pipeline.training.gates import (
    GateClosedError,
    judge_probe,
    read_probe_manifest,
    read_verdict,
    require_open,
    write_probe_manifest,
    write_verdict,
)
from conductor_pipeline.training.stages import (
    PROBE_PHASE,
    TRAINING_PHASE,
    probe_once,
    train_resuming,
    warm_start_checked,
)
from conductor_pipeline.training.telemetry import (
    PARSE_CHECK_AFTER,
)
from resources.pool import PoolResource
from resources.trainer import TrainerResource
from resources.warehouse import WarehouseResource

GROUP = "training"
# "200 steps over 33 questions is memorisation": the contested set must be at least this large.
DEFAULT_MIN_CONTESTED = 100


# ---------------------------------------------------------------------------- contested set


class ContestedConfig(dg.Config):
    """The contested-set rule (conductor_pipeline.probing.contested.ContestedRule) and the size floor."""

    weak: str | None = Field(None, description="Weak worker; empty: the pool's worst by marginal accuracy")
    strong: str | None = Field(None, description="Strong worker; empty: the pool's best by marginal accuracy")
    band_low: float = Field(BAND_LOW, ge=0, le=1, description="Contested if some worker's pass rate is <= this ...")
    band_high: float = Field(BAND_HIGH, ge=0, le=1, description="... and some worker's is >= this")
    confidence: float = Field(0.95, gt=0, lt=1, description="Confidence of the Wilson intervals that must separate")
    corpora: list[str] | None = Field(
        None, description="Only questions of these corpora (e.g. ['math']); empty: every corpus the pool was probed on"
    )
    min_size: int = Field(
        DEFAULT_MIN_CONTESTED, ge=0, description="The size check fails below this ('200 steps over 33 questions is memorisation')"
    )


@dg.asset(
    **stage(GROUP), deps=[pass_rates], kinds={"parquet"},
)
def contested_set(
    context: dg.AssetExecutionContext, config: ContestedConfig, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """Train-split questions that carry a routing decision, re-computed from the cached probes (no new calls)."""
    pool_config = pool.load()
    rule = ContestedRule(
        weak=config.weak, strong=config.strong, band_low=config.band_low, band_high=config.band_high,
        confidence=config.confidence, corpora=None if config.corpora is None else tuple(config.corpora),
    )
    with failing_step():
        selection, rates = choose_contested_set(warehouse.get_warehouse(), pool_config, rule)
    table_path, manifest_path = write_contested_set(
        contested_dir(warehouse), pool_config.name, selection, rule, min_size=config.min_size, run_id=context.run_id
    )
    context.log.info(
        f"contested set of {pool_config.name}: {selection.questions.height} of {selection.counts['candidates']} train "
        f"questions (weak {selection.weak}, strong {selection.strong}); written to {table_path}"
    )
    return dg.MaterializeResult(
        metadata=contested_metadata(pool_config.name, selection, rule, rates, config.min_size, table_path, manifest_path)
    )


@dg.asset_check(asset=contested_set, blocking=True, description="The contested set holds at least min_size questions")
def contested_set_size(warehouse: WarehouseResource, pool: PoolResource) -> dg.AssetCheckResult:
    """'200 steps over 33 questions is memorisation': a small contested set blocks the probe and training."""
    with failing_step():
        manifest = read_contested_manifest(contested_dir(warehouse), pool.load().name)
    size, floor = int(manifest["size"]), int(manifest["min_size"])
    return dg.AssetCheckResult(
        passed=size >= floor,
        metadata={"size": size, "min_size": floor, "weak": manifest["weak"], "strong": manifest["strong"]},
        description=f"{size} contested questions; at least {floor} required",
    )


# ---------------------------------------------------------------------------- warm start


@dg.asset(
    **stage(GROUP, "gpu"), deps=[contested_set], pool=GPU_POOL, kinds={"pytorch"},
)
def warm_start_policy(
    context: dg.AssetExecutionContext, trainer: TrainerResource, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """The policy GRPO starts from: SFT on synthetic valid workflows over the pool's workers (format only)."""
    recipe = recipe_of(trainer)
    training = training_set(warehouse, pool, recipe)
    device, pool_name, base = training_device(trainer), training.pool_config.name, trainer.base_policy_path()
    check_run_id = repeatable_run_id(context, "warm-start", pool_name, base, training)
    started = time.monotonic()
    warm = warm_start_checked(
        base, training, recipe, rollout_executor(training, recipe, pool, training.questions),
        trainer.warm_start_dir(pool_name), check_run_id=check_run_id, device=device, log=context.log.info,
    )
    metadata = {**parse_check_metadata(warm.before, training), **telemetry_metadata(training.store, check_run_id)}
    if warm.after is None:
        return dg.MaterializeResult(metadata={
            **metadata, "prompt": dg.MetadataValue.json(recipe.prompt.model_dump()),
            "model_path": dg.MetadataValue.path(str(base)), "warm_start": False,
        })
    balance = choice_balance(
        training.store.query_file("rollouts_of_phase", {"run_id": check_run_id, "phase": PARSE_CHECK_AFTER})
    )
    trained = warm_start_metadata(warm, warm.after, recipe, balance, time.monotonic() - started)
    return dg.MaterializeResult(metadata={**metadata, **trained, **prompt_metadata(recipe.prompt, warm.model)})


# ---------------------------------------------------------------------------- probe and gate


@dg.asset(
    **stage(GROUP, "gpu"), deps=[contested_set, warm_start_policy], pool=GPU_POOL, kinds={"pytorch", "duckdb"},
)
def grpo_probe_run(
    context: dg.AssetExecutionContext, trainer: TrainerResource, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """A short GRPO run (default 20 steps) on the contested set: does a group's reward ever vary?"""
    recipe = recipe_of(trainer)
    training = training_set(warehouse, pool, recipe)
    pool_config, gate = training.pool_config, recipe.gate
    run = grpo_run(trainer, recipe, training, PROBE_PHASE)
    started = time.monotonic()
    questions = [*training.questions, *training.skipped]  # the pruning audit samples the skipped ones
    manifest = probe_once(
        run, training, grpo_executor_for(training, recipe, warehouse, pool, run, questions),
        prune_audit_questions=recipe.data.prune_audit_questions, dagster_run_id=context.run_id, log=context.log.info,
        progress=observe_progress(context),
    )
    elapsed = time.monotonic() - started
    write_probe_manifest(trainer.probe_dir(pool_config.name), manifest)  # the latest probe: what the gate judges
    preview = judge_probe(manifest, manifest["steps"], threshold=gate.zero_variance_threshold, gate_on=gate.gate_on)
    context.log.info(f"probe {run.run_id}: {len(manifest['steps'])} steps in {elapsed:.0f}s; {preview.describe()}")
    stage_run = StageRun(
        run, f"GRPO probe {run.run_id} (group size {run.settings.num_generations})", recipe, training, elapsed,
        trainer.probe_dir(pool_config.name) / f"{run.run_id}.png",
    )
    return dg.MaterializeResult(metadata=probe_metadata(stage_run, manifest, preview, context.log.error))


@dg.asset_check(
    asset=grpo_probe_run,
    blocking=True,
    description="Strictly fewer than the threshold (default 20%) of probe groups may have zero reward variance "
    "(or, with gate_on=correctness, the same correctness in every rollout)",
)
def zero_variance_gate(trainer: TrainerResource, warehouse: WarehouseResource, pool: PoolResource) -> dg.AssetCheckResult:
    """The gate: judged from the probe's `training_steps` rows; the verdict is persisted for later runs."""
    pool_name = pool.load().name
    manifest = read_probe_manifest(trainer.probe_dir(pool_name))
    if manifest is None:
        return dg.AssetCheckResult(passed=False, description="no probe run recorded")
    logged = warehouse.get_warehouse().query_file("training_steps_of_run", {"run_id": manifest["probe_run_id"]})
    gate = trainer.recipe().gate
    verdict = judge_probe(manifest, logged.iter_rows(named=True), threshold=gate.zero_variance_threshold, gate_on=gate.gate_on)
    write_verdict(trainer.gate_path(pool_name), verdict)
    return dg.AssetCheckResult(passed=verdict.passed, metadata=verdict.summary(), description=verdict.describe())


# ---------------------------------------------------------------------------- training


@dg.asset(
    **stage(GROUP, "gpu"), deps=[grpo_probe_run, contested_set], pool=GPU_POOL, kinds={"pytorch", "duckdb"},
)
def conductor_checkpoint(
    context: dg.AssetExecutionContext, trainer: TrainerResource, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """GRPO of the conductor on the contested set: checkpoints every N steps, resumes from the latest."""
    pool_config = pool.load()
    manifest = read_probe_manifest(trainer.probe_dir(pool_config.name))
    try:
        verdict = require_open(read_verdict(trainer.gate_path(pool_config.name)), manifest and manifest["probe_run_id"])
    except GateClosedError as exc:
        raise dg.Failure(str(exc), metadata={"gate_path": str(trainer.gate_path(pool_config.name))}) from exc
    context.log.info(f"gate open: {verdict.describe()}")
    recipe = recipe_of(trainer)
    training = training_set(warehouse, pool, recipe)
    run = grpo_run(trainer, recipe, training, TRAINING_PHASE)
    started = time.monotonic()
    outcome = train_resuming(
        run, training, grpo_executor_for(training, recipe, warehouse, pool, run, training.questions),
        time_limit_s=recipe.time_limit_s, log=context.log.info, progress=observe_progress(context),
    )
    elapsed = time.monotonic() - started
    context.log.info(
        f"GRPO {run.run_id}: at step {outcome.global_step} after {elapsed:.0f}s "
        f"(resumed from {outcome.resumed_from or 'scratch'}); checkpoint {outcome.checkpoint_dir}"
    )
    stage_run = StageRun(
        run, f"GRPO {pool_config.name} (group size {run.settings.num_generations})", recipe, training, elapsed,
        run.output_dir / "curves.png",
    )
    return dg.MaterializeResult(metadata={
        **checkpoint_metadata(stage_run, outcome, verdict, manifest, context.log.error),
        **prompt_metadata(recipe.prompt, run.output_dir),
    })


TRAINING_ASSETS = [contested_set, warm_start_policy, grpo_probe_run, conductor_checkpoint]
TRAINING_CHECKS = [contested_set_size, zero_variance_gate]

training_job = dg.define_asset_job(
    "training_job",
    selection=dg.AssetSelection.assets(*TRAINING_ASSETS),
    description="Contested set -> warm start -> GRPO probe (zero-variance gate) -> conductor checkpoint",
)
probe_gate_job = dg.define_asset_job(
    "probe_gate_job",
    selection=dg.AssetSelection.assets(contested_set, warm_start_policy, grpo_probe_run),
    description="Everything up to the zero-variance gate, without training: is a GPU-hour worth it?",
)
TRAINING_JOBS = [training_job, probe_gate_job]
