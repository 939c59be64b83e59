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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
from pydantic import Field

from assets.deployment import GPU_POOL  # training, probe and warm start share one GPU: one step at a time
from assets.metadata import png_markdown, stage
from assets.probing import pass_rates
from assets.training_metadata import (
    md_table,
    probe_audit_metadata,
    pruning_metadata,
    run_metadata,
    telemetry_metadata,
)
from assets.world_model import world_model_path
from conductor_pipeline.conductor.hf_policy import policy_fingerprint
from conductor_pipeline.conductor.prompt import PromptSpec, write_trained_prompt
from conductor_pipeline.evaluation.learning import choice_balance
from conductor_pipeline.probing.contested import BAND_HIGH, BAND_LOW, ContestedRule, pass_rate_histogram
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_fingerprint
from conductor_pipeline.training.dataset import (
    TrainingDataError,
    TrainingSet,
    bonus_predictor,
    build_training_set,
    choose_contested_set,
    pruning_report,
    read_contested_manifest,
    write_contested_set,
)
from conductor_pipeline.training.gates import (
    RUN_MANIFEST,
    GateClosedError,
    judge_probe,
    probe_manifest,
    read_probe_manifest,
    read_verdict,
    require_open,
    write_probe_manifest,
    write_verdict,
)
from conductor_pipeline.training.grpo import remove_checkpoints
from conductor_pipeline.training.plots import sft_loss_png
from conductor_pipeline.training.recipe import Recipe
from conductor_pipeline.training.rollouts import PoolExecutor, frozen_conductor, parse_check
from conductor_pipeline.training.runs import (
    balance_markdown,
    forget_steps_after_checkpoint,
    format_metric,
    policy_name,
    rollout_summary,
    run_pool_grpo,
    run_telemetry,
)
from conductor_pipeline.training.sft import final_loss, read_sft_history, warm_start_sft
from conductor_pipeline.training.synthetic import MAX_FAN_OUT, warm_start_pairs
from conductor_pipeline.training.telemetry import (
    PARSE_CHECK_AFTER,
    PARSE_CHECK_BEFORE,
    RolloutLog,
    RowBuffer,
    forget_run,
    rollout_run_id,
)
from conductor_pipeline.workflow import PARSE_OK
from resources.pool import PoolResource
from resources.trainer import TrainerResource
from resources.warehouse import WarehouseResource

GROUP = "training"
# "200 steps over 33 questions is memorisation": the contested set must be at least this large.
DEFAULT_MIN_CONTESTED = 100
NO_FLIPS_NOTE = "n/a: one recording per question (a one-sample probe IS the probe here)"


# ---------------------------------------------------------------------------- wiring


@contextmanager
def _failing_step() -> Iterator[None]:
    """Training data that cannot be assembled fails the step with the library's message."""
    try:
        yield
    except TrainingDataError as exc:
        raise dg.Failure(str(exc)) from exc


def contested_dir(warehouse: WarehouseResource) -> Path:
    """Where the contested set's files live: next to the warehouse."""
    return warehouse.artifact_dir("contested_set")


def _recipe(trainer: TrainerResource) -> Recipe:
    """The trainer's recipe; one whose settings contradict each other fails the step, saying which."""
    try:
        return trainer.recipe()
    except ValueError as exc:
        raise dg.Failure(str(exc)) from exc


def _training_set(warehouse: WarehouseResource, pool: PoolResource, recipe: Recipe) -> TrainingSet:
    pool_config = pool.load()
    prompt, data = recipe.prompt, recipe.data
    with _failing_step():
        return build_training_set(
            warehouse.get_warehouse(), pool_config, contested_dir(warehouse),
            naming=prompt.naming, n_examples=prompt.n_examples, contested_subpools=data.contested_subpools,
            prune_with=world_model_path(warehouse, pool_config.name) if data.prune_with_world_model else None,
            prune_low=data.prune_low, prune_high=data.prune_high, show_predicted_success=prompt.show_predicted_success,
            ranked_catalogue=prompt.ranked_catalogue,
        )


def _prompt_metadata(prompt: PromptSpec, model_folder: Path) -> dict[str, dg.MetadataValue]:
    """The training prompt as metadata, also written beside the weights (`write_trained_prompt`), so
    a checkpoint evaluated by path on any pool is prompted as it was trained."""
    write_trained_prompt(model_folder, prompt)
    return {"prompt": dg.MetadataValue.json(prompt.model_dump())}


def _device(trainer: TrainerResource) -> str:
    """The device this step trains and samples the policy on (`TrainerResource.training_device`)."""
    try:
        return trainer.training_device()
    except ValueError as exc:
        raise dg.Failure(str(exc)) from exc


def _rollout_executor(
    training: TrainingSet, recipe: Recipe, pool: PoolResource, questions: Sequence[Question], **kwargs: object
) -> PoolExecutor:
    """Rollouts on the pool's workers (conductor seats are answered by the executor's conductor
    policy, not a Worker), sampled like GRPO's and recursing at most `recipe.max_depth` levels."""
    pool_config = training.pool_config
    workers = pool.build_workers([seat.name for seat in pool_config.workers if not seat.is_conductor])
    return PoolExecutor(
        pool_config, workers, questions, training.naming, max_depth=recipe.max_depth,
        temperature=recipe.prompt.temperature, max_new_tokens=recipe.prompt.max_new_tokens, **kwargs,
    )


def _executor(
    training: TrainingSet, recipe: Recipe, warehouse: WarehouseResource,
    pool: PoolResource, questions: Sequence[Question], log: RolloutLog, start_policy: Path | str, device: str,
) -> PoolExecutor:
    """GRPO's rollouts, recorded under `log`, with W's predictions when the reward bonus is on; a
    frozen copy of `start_policy` answers conductor steps when the pool seats the conductor."""
    pool_config = training.pool_config
    with _failing_step():
        predict = bonus_predictor(
            recipe.grpo.world_model_bonus_weight, world_model_path(warehouse, pool_config.name), pool_config.workers
        )
    return _rollout_executor(
        training, recipe, pool, questions, predict_success=predict, log=log,
        conductor_policy=frozen_conductor(pool_config, start_policy, device),
    )


def _observe_progress(context: dg.AssetExecutionContext) -> Callable[[dict], None]:
    """Each progress report of a running GRPO run as an observation of the asset, so the UI plots
    step, rollouts per second and the reward trend while the run goes (a GPU run lasts hours)."""

    def observe(figures: dict) -> None:
        numbers = {key: float(value) for key, value in figures.items() if isinstance(value, (int, float))}
        context.log_event(dg.AssetObservation(asset_key=context.asset_key, metadata=numbers))

    return observe


def _repeatable_run_id(
    context: dg.AssetExecutionContext, kind: str, pool: str, policy: Path | str, training: TrainingSet
) -> str:
    """The id the warm start's parse-check rollouts are logged under: what decides them (the asset's
    code version, the policy's weights, the questions), so a rerun after an interruption is the same
    run and starts by deleting what the interrupted attempt left (`forget_run`)."""
    code_version = context.assets_def.code_versions_by_key.get(context.asset_key)
    run_id = rollout_run_id(kind, pool, code_version, policy_fingerprint(policy), [q.question_id for q in training.questions])
    forget_run(training.store, run_id)
    return run_id


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
    with _failing_step():
        selection, rates = choose_contested_set(warehouse.get_warehouse(), pool_config, rule)
    table_path, manifest_path = write_contested_set(
        contested_dir(warehouse), pool_config.name, selection, rule, min_size=config.min_size, run_id=context.run_id
    )
    chosen = selection.questions
    histogram = pass_rate_histogram(rates)
    reasons = chosen.group_by("reason").len().sort("reason")
    samples = rates["samples"]
    flips = selection.one_sample_flips
    context.log.info(
        f"contested set of {pool_config.name}: {chosen.height} of {selection.counts['candidates']} train questions "
        f"(weak {selection.weak}, strong {selection.strong}); written to {table_path}"
    )
    return dg.MaterializeResult(
        metadata={
            "pool": dg.MetadataValue.text(pool_config.name),
            "size": dg.MetadataValue.int(chosen.height),
            "min_size": dg.MetadataValue.int(config.min_size),
            "rule": dg.MetadataValue.json({**rule.as_dict(), "weak_resolved": selection.weak, "strong_resolved": selection.strong}),
            "counts_per_class": md_table(list(selection.counts.items()), ["class", "questions"]),
            "counts_per_reason": md_table(reasons.rows(), ["reason", "questions"]),
            "one_sample_flips": (
                dg.MetadataValue.text(NO_FLIPS_NOTE) if flips is None
                else md_table(sorted(flips.items()), ["one-sample -> k-sample class", "questions"])
            ),
            "pool_mean_pass_rate_histogram": md_table(histogram.rows(), histogram.columns),
            "samples_per_pair": dg.MetadataValue.text(f"min {samples.min()}, max {samples.max()}"),
            "split_fingerprint": dg.MetadataValue.text(split_fingerprint()),
            "split": dg.MetadataValue.text("train only"),
            "table_path": dg.MetadataValue.path(str(table_path)),
            "manifest_path": dg.MetadataValue.path(str(manifest_path)),
        }
    )


@dg.asset_check(asset=contested_set, blocking=True, description="The contested set holds at least min_size questions")
def contested_set_size(warehouse: WarehouseResource, pool: PoolResource) -> dg.AssetCheckResult:
    """'200 steps over 33 questions is memorisation': a small contested set blocks the probe and training."""
    with _failing_step():
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
    recipe = _recipe(trainer)
    training = _training_set(warehouse, pool, recipe)
    pool_config, warm = training.pool_config, recipe.warm_start
    device = _device(trainer)
    started = time.monotonic()
    base = trainer.base_policy_path()
    # Exactly the GRPO prompts (same sub-pools, naming, examples): the format learnt is the one scored.
    rows = training.prompt_rows(recipe.grpo)
    check_rows = rows[: warm.parse_check_prompts]
    samples = warm.parse_check_samples
    n_checked = len(check_rows) * samples
    # Every parse-check sample is a rollout: executed on the pool and recorded under this run id.
    check_run_id = _repeatable_run_id(context, "warm-start", pool_config.name, base, training)
    with RowBuffer(training.store) as writer:
        executor = _rollout_executor(training, recipe, pool, training.questions)

        def check(model: Path | str, phase: str) -> tuple[float, dict[str, int]]:
            executor.log = RolloutLog(writer, check_run_id, phase, policy_name(model))
            return parse_check(
                model, check_rows, recipe.prompt.naming, recipe.prompt.max_new_tokens, samples, executor=executor,
                device=device,
            )

        before, codes_before = check(base, PARSE_CHECK_BEFORE)
        context.log.info(f"base policy {base}: parse rate {before:.2f} on {n_checked} samples")
        metadata: dict[str, dg.MetadataValue] = {
            "base_policy": dg.MetadataValue.text(str(base)),
            "device": dg.MetadataValue.text(device),
            "parse_rate_before": dg.MetadataValue.float(before),
            "parse_codes_before": dg.MetadataValue.json(codes_before),
            "parse_check": dg.MetadataValue.text(f"{len(check_rows)} prompts x {samples} samples, temperature 1"),
            **pruning_metadata(training),
        }
        if not warm.enabled:
            context.log.info("warm start disabled: GRPO starts from the base policy")
            return dg.MaterializeResult(metadata={
                **metadata, **telemetry_metadata(training.store, check_run_id),
                "prompt": dg.MetadataValue.json(recipe.prompt.model_dump()),
                "model_path": dg.MetadataValue.path(str(base)), "warm_start": False,
            })
        style = warm.style
        pairs = warm_start_pairs(
            rows, n=warm.examples, seed=recipe.seed + 1, naming=recipe.prompt.naming, style=style,
            aggregators=pool_config.vote_seat_names, fan_out_only=warm.fan_out, max_fan_out=warm.max_fan_out,
        )
        sft = recipe.sft
        context.log.info(f"warm start: {len(pairs)} synthetic pairs ({style} style), {sft.max_steps} SFT steps")
        sft_started = time.monotonic()
        out = warm_start_sft(base, pairs, sft, trainer.warm_start_dir(pool_config.name))
        sft_elapsed = time.monotonic() - sft_started
        after, codes_after = check(out, PARSE_CHECK_AFTER)
    history = read_sft_history(out)
    balance = choice_balance(
        training.store.query_file("rollouts_of_phase", {"run_id": check_run_id, "phase": PARSE_CHECK_AFTER})
    )
    elapsed = time.monotonic() - started
    context.log.info(
        f"warm start done in {elapsed:.0f}s: parse rate {before:.2f} -> {after:.2f} at temperature 1 "
        f"({n_checked} samples; failures {dict((c, n) for c, n in codes_after.items() if c != PARSE_OK)}); model at {out}"
    )
    metadata.update(
        model_path=dg.MetadataValue.path(str(out)),
        warm_start=dg.MetadataValue.bool(True),
        parse_rate_after=dg.MetadataValue.float(after),
        parse_codes_after=dg.MetadataValue.json(codes_after),
        synthetic_pairs=dg.MetadataValue.int(len(pairs)),
        synthetic_style=dg.MetadataValue.text(style),
        fan_out_warm_start=dg.MetadataValue.bool(warm.fan_out),
        max_fan_out=dg.MetadataValue.int(warm.max_fan_out or MAX_FAN_OUT[style]),
        sft_steps=dg.MetadataValue.int(sft.max_steps),
        final_loss=dg.MetadataValue.float(final_loss(history)),
        sft_elapsed_s=dg.MetadataValue.float(round(sft_elapsed, 1)),
        elapsed_s=dg.MetadataValue.float(round(elapsed, 1)),
        **telemetry_metadata(training.store, check_run_id),
        **_prompt_metadata(recipe.prompt, out),
        choice_balance=dg.MetadataValue.json(balance),
        choice_balance_summary=dg.MetadataValue.md(balance_markdown(balance)),
    )
    png = sft_loss_png(history)
    if png is not None:
        metadata["loss_curve"] = png_markdown(png, "SFT loss")
    return dg.MaterializeResult(metadata=metadata)


# ---------------------------------------------------------------------------- probe and gate


@dg.asset(
    **stage(GROUP, "gpu"), deps=[contested_set, warm_start_policy], pool=GPU_POOL, kinds={"pytorch", "duckdb"},
)
def grpo_probe_run(
    context: dg.AssetExecutionContext, trainer: TrainerResource, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """A short GRPO run (default 20 steps) on the contested set: does a group's reward ever vary?"""
    recipe = _recipe(trainer)
    training = _training_set(warehouse, pool, recipe)
    pool_config, store, gate = training.pool_config, training.store, recipe.gate
    settings = recipe.probe()
    device = _device(trainer)
    start_policy = trainer.start_policy_path(pool_config.name)
    probe_run_id = f"probe-{pool_config.name}-{trainer.run_key(recipe, settings, training, start_policy)}"
    output_dir = trainer.probe_dir(pool_config.name) / probe_run_id
    started = time.monotonic()
    manifest = read_probe_manifest(output_dir, RUN_MANIFEST)  # a probe of the same inputs that finished
    if manifest is not None and len(manifest["steps"]) >= settings.max_steps:
        context.log.info(f"probe {probe_run_id} of these inputs already finished (dagster run {manifest['dagster_run_id']})")
    else:
        # An unfinished probe of the same inputs (a killed run) starts again from scratch, its rows
        # deleted first, so its figures are an uninterrupted probe's.
        forget_run(store, probe_run_id)
        context.log.info(f"probe {probe_run_id}: starting")
        with RowBuffer(store) as writer:
            executor = _executor(
                training, recipe, warehouse, pool, [*training.questions, *training.skipped],
                RolloutLog(writer, probe_run_id, "probe", policy_name(start_policy)), start_policy, device,
            )
            run_pool_grpo(
                start_policy, training, executor, settings, output_dir,
                run_id=probe_run_id, phase="probe", resume=False, log=context.log.info,
                progress=_observe_progress(context),
            )
            pruning = pruning_report(
                start_policy, training, executor, settings, recipe.data.prune_audit_questions, device
            )
        if pruning is not None:
            context.log.info(f"world-model pruning: {pruning}")
        logged = store.query_file("training_steps_of_run", {"run_id": probe_run_id}).iter_rows(named=True)
        manifest = probe_manifest(
            probe_run_id, logged, group_size=settings.num_generations, groups_per_step=settings.questions_per_step,
            dagster_run_id=context.run_id, contested_questions=len(training.questions) + len(training.skipped),
            trained_questions=len(training.questions), world_model_pruning=pruning,
        )
        write_probe_manifest(output_dir, manifest, RUN_MANIFEST)
        # The probe's weights are not a product: keep its logs, drop the checkpoints (GBs on the GPU profile).
        remove_checkpoints(output_dir)
    elapsed = time.monotonic() - started
    pruning = manifest.get("world_model_pruning")
    write_probe_manifest(trainer.probe_dir(pool_config.name), manifest)  # the latest probe: what the gate judges
    preview = judge_probe(manifest, manifest["steps"], threshold=gate.zero_variance_threshold, gate_on=gate.gate_on)
    steps_done = len(manifest["steps"])
    context.log.info(f"probe {probe_run_id}: {steps_done} steps in {elapsed:.0f}s; {preview.describe()}")
    telemetry = run_telemetry(store, probe_run_id, pool_config.vote_seat_names)
    summary = (
        f"{steps_done} probe steps in {elapsed:.0f}s: {preview.reward_figure:.3f} of {preview.groups} groups "
        f"(group size {settings.num_generations}; the paper's is 64) had zero reward variance and "
        f"{format_metric(preview.correctness_figure)} the same correctness in every rollout (no routing signal); "
        f"the gate judges {preview.gate_on} and needs < {gate.zero_variance_threshold:.2f}. "
        f"{rollout_summary(telemetry)}"
    )
    return dg.MaterializeResult(
        metadata={
            "summary": dg.MetadataValue.text(summary),
            "probe_run_id": dg.MetadataValue.text(probe_run_id),
            "zero_variance_fraction": dg.MetadataValue.float(preview.figure),
            "flat_reward_fraction": dg.MetadataValue.float(preview.reward_figure),
            "same_correctness_fraction": (
                dg.MetadataValue.float(preview.correctness_figure) if preview.correctness_figure is not None
                else dg.MetadataValue.text("not measured")
            ),
            "gate_on": dg.MetadataValue.text(preview.gate_on),
            "group_size": dg.MetadataValue.int(settings.num_generations),
            "groups": dg.MetadataValue.int(preview.groups),
            "threshold": dg.MetadataValue.float(gate.zero_variance_threshold),
            "steps": dg.MetadataValue.int(steps_done),
            "elapsed_s": dg.MetadataValue.float(round(elapsed, 1)),
            "seconds_per_step": dg.MetadataValue.float(round(elapsed / max(steps_done, 1), 2)),
            "settings": dg.MetadataValue.json(settings.describe()),
            "device": dg.MetadataValue.text(device),
            "contested_subpools": dg.MetadataValue.bool(recipe.data.contested_subpools),
            "world_model_pruning": dg.MetadataValue.json(pruning) if pruning else dg.MetadataValue.text("off"),
            **({"pruned_questions": dg.MetadataValue.int(len(training.skipped))} if pruning else {}),
            **run_metadata(
                telemetry, probe_run_id, f"GRPO probe {probe_run_id} (group size {settings.num_generations})",
                trainer.probe_dir(pool_config.name) / f"{probe_run_id}.png", gate.zero_variance_threshold, context.log.error,
            ),
        }
    )


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
    recipe = _recipe(trainer)
    training = _training_set(warehouse, pool, recipe)
    store, settings = training.store, recipe.grpo
    device = _device(trainer)
    start_policy = trainer.start_policy_path(pool_config.name)
    run_id = f"grpo-{pool_config.name}-{trainer.run_key(recipe, settings, training, start_policy)}"
    output_dir = trainer.checkpoint_dir(pool_config.name) / run_id
    resume_step = forget_steps_after_checkpoint(store, run_id, output_dir)
    context.log.info(
        f"GRPO run {run_id}: " + (f"resuming after step {resume_step}" if resume_step else "starting at step 1")
        + f" (a run of other settings, prompts, pool, questions or start policy gets another key); output {output_dir}"
    )
    started = time.monotonic()
    with RowBuffer(store) as writer:
        executor = _executor(
            training, recipe, warehouse, pool, training.questions,
            RolloutLog(writer, run_id, "grpo", policy_name(start_policy)), start_policy, device,
        )
        outcome = run_pool_grpo(
            start_policy, training, executor, settings, output_dir,
            run_id=run_id, phase="grpo", resume=True, log=context.log.info, time_limit_s=recipe.time_limit_s,
            progress=_observe_progress(context),
        )
    elapsed = time.monotonic() - started
    context.log.info(
        f"GRPO {run_id}: at step {outcome.global_step} after {elapsed:.0f}s "
        f"(resumed from {outcome.resumed_from or 'scratch'}); checkpoint {outcome.checkpoint_dir}"
    )
    return dg.MaterializeResult(
        metadata={
            "checkpoint_path": dg.MetadataValue.path(str(outcome.checkpoint_dir)),
            "checkpoint": dg.MetadataValue.text(
                f"{outcome.checkpoint_dir} (group size {outcome.group_size}, {elapsed:.0f}s"
                f"{', resumed from ' + outcome.resumed_from.name if outcome.resumed_from else ''})"
            ),
            "global_step": dg.MetadataValue.int(outcome.global_step),
            "step": dg.MetadataValue.int(outcome.global_step),
            "resumed_from": dg.MetadataValue.text(str(outcome.resumed_from) if outcome.resumed_from else "none"),
            "stopped_early": dg.MetadataValue.bool(outcome.stopped_early),
            "group_size": dg.MetadataValue.int(outcome.group_size),
            "training_run_id": dg.MetadataValue.text(run_id),
            "tensorboard_logdir": dg.MetadataValue.path(str(output_dir / "runs")),
            "elapsed_s": dg.MetadataValue.float(round(elapsed, 1)),
            "gate": dg.MetadataValue.json(verdict.summary()),
            "settings": dg.MetadataValue.json(settings.describe()),
            "device": dg.MetadataValue.text(device),
            **_prompt_metadata(recipe.prompt, output_dir),
            **pruning_metadata(training),
            **probe_audit_metadata(manifest),
            **run_metadata(
                run_telemetry(store, run_id, pool_config.vote_seat_names), run_id, f"GRPO {pool_config.name} (group size {settings.num_generations})",
                output_dir / "curves.png", recipe.gate.zero_variance_threshold, context.log.error,
            ),
        }
    )


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
