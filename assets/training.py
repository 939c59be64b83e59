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

import asyncio
import json
import math
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import polars as pl
from pydantic import Field
from tabulate import tabulate

from assets.deployment import GPU_POOL  # training, probe and warm start share one GPU: one step at a time
from assets.metadata import png_markdown
from assets.probing import pass_rates
from assets.world_model import world_model_path
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.conductor.policies import HFLocalPolicy
from conductor_pipeline.conductor.prompt import (
    CatalogueEntry,
    PromptExample,
    build_conductor_prompt,
    catalogue_from_pool,
    default_examples,
    displayed_worker_names,
)
from conductor_pipeline.paths import write_json_atomic
from conductor_pipeline.plots import sft_loss_png, training_curves_png
from conductor_pipeline.pools.backends.base import Worker
from conductor_pipeline.pools.config import PoolConfig
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.probing.calibration import (
    BAND_HIGH,
    BAND_LOW,
    ContestedRule,
    pass_rate_histogram,
    routing_anchors,
    select_contested,
)
from conductor_pipeline.probing.pass_rates import pass_rate_table
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_fingerprint, split_of, train_split_rows
from conductor_pipeline.training.gates import (
    GateClosedError,
    GateVerdict,
    evaluate_zero_variance,
    read_verdict,
    require_open,
    write_verdict,
)
from conductor_pipeline.training.grpo import TrainingOutcome, _checkpoint_step, _last_checkpoint, train_grpo
from conductor_pipeline.training.reward import RolloutVerdict, make_conductor_reward, reward_for
from conductor_pipeline.training.rollouts import conductor_prompt_rows
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.training.sft import SFT_LOG_HISTORY, warm_start_sft
from conductor_pipeline.training.synthetic import warm_start_pairs
from conductor_pipeline.warehouse import Warehouse, load_sql
from conductor_pipeline.workflow import PARSE_OK, parse_code
from conductor_pipeline.world_model.hooks import audit_pruning, prompt_predictor, prune_zero_variance
from conductor_pipeline.world_model.model import WorldModel
from resources.pool import PoolResource
from resources.trainer import TrainerResource
from resources.warehouse import WarehouseResource

GROUP = "training"
# "200 steps over 33 questions is memorisation": the contested set must be at least this large.
DEFAULT_MIN_CONTESTED = 100
# Progress lines at most this often (a CPU step takes about a second, a GPU step minutes).
PROGRESS_LOG_INTERVAL_S = 10.0
# Parse rate before/after the warm start: this many prompts x samples at temperature 1. 64 samples
# tell 6% from 90% at a glance and cost a few seconds on the tiny model.
PARSE_CHECK_PROMPTS = 8
PARSE_CHECK_SAMPLES = 8
PROBE_MANIFEST = "latest_probe.json"
NO_FLIPS_NOTE = "n/a: one recording per question (a one-sample probe IS the probe here)"


# ---------------------------------------------------------------------------- shared helpers


def _contested_paths(warehouse: WarehouseResource, pool_name: str) -> tuple[Path, Path]:
    folder = warehouse.artifact_dir("contested_set")
    return folder / f"{pool_name}.parquet", folder / f"{pool_name}.json"


def read_contested_manifest(warehouse: WarehouseResource, pool_name: str) -> dict:
    """The contested set's manifest (rule, counts, question ids); Failure if not materialized."""
    _, manifest_path = _contested_paths(warehouse, pool_name)
    if not manifest_path.is_file():
        raise dg.Failure(f"no contested set for pool {pool_name!r} at {manifest_path}: materialize contested_set first")
    return json.loads(manifest_path.read_text())


def _contested_questions(store: Warehouse, manifest: Mapping) -> list[Question]:
    ids = list(manifest["question_ids"])
    leaked = [q for q in ids if split_of(q) != "train"]
    if leaked:  # the manifest is a file: refuse one edited or built under another split
        raise dg.Failure(f"{len(leaked)} contested questions are not in the train split (e.g. {leaked[:3]})")
    frame = store.query_file("questions_by_ids", {"ids": ids})
    if frame.height != len(ids):
        raise dg.Failure(f"{len(ids) - frame.height} contested questions are missing from the questions table")
    return [Question(**row) for row in frame.iter_rows(named=True)]


def _train_pass_rates(store: Warehouse, pool_config: PoolConfig) -> pl.DataFrame:
    """Train-split pass rates of the pool's workers (question_id, worker, samples, successes)."""
    return train_split_rows(pass_rate_table(store, pool_config.name), pool_config.worker_names).select(
        "question_id", "worker", "samples", "successes"
    )


@dataclass
class TrainingSet:
    """What GRPO trains on: the contested questions (less any the world model pruned) and, per
    question, the workers its random sub-pool must show (empty when sub-pools are unconstrained)."""

    pool_config: PoolConfig
    store: Warehouse
    questions: list[Question]
    anchors: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    skipped: list[Question] = field(default_factory=list)
    pruning: dict[str, object] | None = None  # None: pruning off

    def pruning_metadata(self) -> dict[str, dg.MetadataValue]:
        if self.pruning is None:
            return {"world_model_pruning": dg.MetadataValue.text("off")}
        return {
            "world_model_pruning": dg.MetadataValue.json(self.pruning),
            "pruned_questions": dg.MetadataValue.int(len(self.skipped)),
        }


def _load_world_model(warehouse: WarehouseResource, pool_config: PoolConfig, knob: str) -> tuple[WorldModel, Path]:
    """The pool's world model, for a trainer knob that needs it (pruning, the reward bonus)."""
    path = world_model_path(warehouse, pool_config.name)
    if not path.is_file():
        raise dg.Failure(f"{knob} is on but no world model is at {path}: materialize world_model first")
    return WorldModel.load(path), path


def _prune(trainer: TrainerResource, warehouse: WarehouseResource, pool_config: PoolConfig, questions: list[Question]):
    """(kept, skipped, summary): questions W predicts every worker solves, or none does, are skipped."""
    model, path = _load_world_model(warehouse, pool_config, "prune_with_world_model")
    kept, skipped = prune_zero_variance(
        model, questions, pool_config.workers, low=trainer.prune_low, high=trainer.prune_high
    )
    if not kept:
        raise dg.Failure(f"the world model at {path} pruned all {len(questions)} contested questions: nothing to train on")
    summary = {
        "world_model": str(path), "low": trainer.prune_low, "high": trainer.prune_high,
        "contested": len(questions), "kept": len(kept), "skipped": len(skipped),
    }
    return kept, skipped, summary


def _bonus_predictor(
    trainer: TrainerResource, warehouse: WarehouseResource, pool_config: PoolConfig
) -> Callable[[Question], dict[str, float]] | None:
    """W's per-worker P(success) for the reward bonus; None while the bonus is off (the default)."""
    if trainer.world_model_bonus_weight == 0:
        return None
    model, _ = _load_world_model(warehouse, pool_config, "world_model_bonus_weight")
    return prompt_predictor(model, pool_config.workers)


def _training_set(warehouse: WarehouseResource, pool: PoolResource, trainer: TrainerResource) -> TrainingSet:
    pool_config = pool.load()
    store = warehouse.get_warehouse()
    questions = _contested_questions(store, read_contested_manifest(warehouse, pool_config.name))
    anchors = routing_anchors(_train_pass_rates(store, pool_config)) if trainer.contested_subpools else {}
    if not trainer.prune_with_world_model:
        return TrainingSet(pool_config, store, questions, anchors)
    kept, skipped, summary = _prune(trainer, warehouse, pool_config, questions)
    return TrainingSet(pool_config, store, kept, anchors, skipped, summary)


def _seat_catalogue(pool_config: PoolConfig) -> dict[str, CatalogueEntry]:
    return {entry.name: entry for entry in catalogue_from_pool(pool_config)}


def _examples(trainer: TrainerResource) -> list[PromptExample]:
    return default_examples(trainer.n_prompt_examples)


def _prompt_rows(
    questions: Sequence[Question],
    pool_config: PoolConfig,
    trainer: TrainerResource,
    settings: GRPOSettings,
    anchors: Mapping[str, tuple[list[str], list[str]]] | None = None,
) -> list[dict]:
    """GRPO dataset rows: each question with the (possibly random) sub-pool its prompt shows;
    with `anchors`, that sub-pool holds one of the question's best and one of its worst workers."""
    catalogue = _seat_catalogue(pool_config)
    examples = _examples(trainer)

    def build_messages(question: Question, shown: Sequence[str]) -> list[dict]:
        return build_conductor_prompt(question, [catalogue[n] for n in shown], naming=trainer.naming, examples=examples)

    return conductor_prompt_rows(
        questions,
        pool_config.worker_names,
        build_messages,
        randomize_pools=settings.randomize_pools,
        min_pool_size=settings.min_pool_size,
        seed=settings.seed,
        must_show=(lambda q: anchors.get(q.question_id, ())) if anchors else None,
    )


class PoolExecutor:
    """The reward's `execute`: parse a rollout against the sub-pool its prompt showed, run it, grade it.

    Orchestrators and governors are built per event loop (asyncio primitives bind to the loop that
    first waits on them; TRL awaits async rewards on its own loop thread) and per shown sub-pool.
    Nothing is recorded in the warehouse (the per-step aggregates go to `training_steps`); each
    verdict is kept in memory per question (`observed`) for the pruning audit.
    """

    def __init__(
        self,
        pool_config: PoolConfig,
        workers: Mapping[str, Worker],
        questions: Sequence[Question],
        naming: str,
        predict_success: Callable[[Question], dict[str, float]] | None = None,
    ):
        self.pool = pool_config
        self.workers = dict(workers)
        self.questions = {q.question_id: q for q in questions}
        self.naming = naming
        # W's P(success) per worker, for the reward bonus; computed once per question.
        self.predict_success = predict_success
        self._predicted: dict[str, dict[str, float]] = {}
        self._orchestrators: dict[tuple[int, tuple[str, ...]], Orchestrator] = {}
        self._governors: dict[int, Governor] = {}
        self.observed: dict[str, list[RolloutVerdict]] = {}

    def _orchestrator(self, shown: tuple[str, ...]) -> Orchestrator:
        loop_id = id(asyncio.get_running_loop())
        key = (loop_id, shown)
        if key not in self._orchestrators:
            governor = self._governors.setdefault(loop_id, Governor.from_pool(self.pool))
            sub_pool = self.pool.model_copy(update={"workers": [self.pool.seat(name) for name in shown]})
            self._orchestrators[key] = Orchestrator(sub_pool, self.workers, governor, None, naming=self.naming)
        return self._orchestrators[key]

    async def __call__(self, completion: str, row: dict) -> RolloutVerdict:
        orchestrator = self._orchestrator(tuple(row["workers"]))
        question = self.questions[row["question_id"]]
        code, correct, final_worker = await orchestrator.score_completion(question, completion)
        verdict = RolloutVerdict(code, correct, expected_success=self._expected(question, final_worker))
        self.observed.setdefault(row["question_id"], []).append(verdict)
        return verdict

    def _expected(self, question: Question, worker: str | None) -> float | None:
        if self.predict_success is None or worker is None:
            return None
        if question.question_id not in self._predicted:
            self._predicted[question.question_id] = self.predict_success(question)
        return self._predicted[question.question_id].get(worker)  # None for a conductor seat

    def observed_rewards(self, variant: str) -> dict[str, list[float]]:
        """Question id -> the scored rewards of its rollouts so far (infrastructure failures left out)."""
        rewards = {qid: [reward_for(v, variant) for v in verdicts] for qid, verdicts in self.observed.items()}
        return {qid: [r for r in values if r is not None] for qid, values in rewards.items()}


def _warehouse_row(run_id: str, phase: str, row: Mapping) -> dict:
    """A `training_steps` row from a `step_row` dict (TRL's logs plus our parse-code tally)."""
    counts = dict(row.get("parse_code_counts") or {})
    fail_rate = row.get("parse_fail_rate")
    if fail_rate is None and counts:
        scored = sum(n for code, n in counts.items() if code != "infrastructure")
        fail_rate = (scored - counts.get("ok", 0)) / scored if scored else None
    return {
        "run_id": run_id,
        "step": int(row["step"]),
        "phase": phase,
        "reward_mean": row.get("reward_mean"),
        "reward_std": row.get("reward_std"),
        "frac_zero_std": row.get("frac_zero_std"),
        "parse_fail_rate": fail_rate,
        "parse_codes": json.dumps(counts, sort_keys=True),
        "group_size": row.get("group_size"),
        "completion_length": row.get("completion_length_mean"),
        "loss": row.get("loss"),
        "learning_rate": row.get("learning_rate"),
        "infra_excluded": row.get("infra_fail_rate"),
    }


def _run_grpo(
    context: dg.AssetExecutionContext,
    *,
    training: TrainingSet,
    executor: PoolExecutor,
    trainer: TrainerResource,
    settings: GRPOSettings,
    output_dir: Path,
    run_id: str,
    phase: str,
    resume: bool,
) -> TrainingOutcome:
    """GRPO on the training set with rollouts executed against the pool; one warehouse row per step."""
    store, pool_config = training.store, training.pool_config
    rows = _prompt_rows(training.questions, pool_config, trainer, settings, training.anchors)
    reward = make_conductor_reward(
        executor, settings.reward_variant, cost_weight=settings.cost_weight, group_size=settings.num_generations,
        bonus_weight=settings.world_model_bonus_weight,
    )
    started = time.monotonic()
    last_log = [0.0]
    first_step: list[int] = []
    time_limit = trainer.time_limit_s if phase == "grpo" else None

    def on_step(step: dict) -> bool:
        store.insert("training_steps", [_warehouse_row(run_id, phase, step)])
        first_step[:1] = first_step[:1] or [step["step"]]
        elapsed = time.monotonic() - started
        done = step["step"] - first_step[0] + 1
        if elapsed - last_log[0] >= PROGRESS_LOG_INTERVAL_S or step["step"] >= settings.max_steps:
            last_log[0] = elapsed
            context.log.info(
                f"{phase} {run_id}: step {step['step']}/{settings.max_steps} ({elapsed / done:.1f} s/step); "
                f"reward {_fmt(step.get('reward_mean'))}, zero-std groups {_fmt(step.get('frac_zero_std'))} "
                f"(group size {settings.num_generations}), parse failures {_fmt(step.get('parse_fail_rate'))}"
            )
        return bool(time_limit and elapsed > time_limit)

    context.log.info(
        f"{phase} {run_id}: {len(rows)} prompts, {settings.questions_per_step} questions x "
        f"{settings.num_generations} rollouts per step, {settings.max_steps} steps, output {output_dir}"
    )
    return train_grpo(
        trainer.start_policy_path(pool_config.name), rows, reward, settings, output_dir, on_step=on_step, resume=resume
    )


def _fmt(value: object, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _curve_metadata(store: Warehouse, run_id: str, title: str, png_path: Path, threshold: float | None = None) -> dict:
    frame = store.query_file("training_steps_of_run", {"run_id": run_id})
    if frame.is_empty():
        return {}
    png = training_curves_png(frame, title, threshold)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    png_path.write_bytes(png)
    last = frame.row(-1, named=True)
    codes: dict[str, int] = {}
    for raw in frame["parse_codes"].to_list():
        for code, n in (json.loads(raw) if raw else {}).items():
            codes[code] = codes.get(code, 0) + n
    return {
        "curves": png_markdown(png, title),
        "curves_path": dg.MetadataValue.path(str(png_path)),
        "steps_logged": dg.MetadataValue.int(frame.height),
        "last_reward_mean": dg.MetadataValue.float(float(last["reward_mean"] or 0.0)),
        "last_parse_fail_rate": dg.MetadataValue.float(float(last["parse_fail_rate"] or 0.0)),
        "parse_code_counts": dg.MetadataValue.md(
            tabulate(sorted(codes.items(), key=lambda kv: -kv[1]), headers=["outcome", "rollouts"], tablefmt="github")
        ),
    }


# ---------------------------------------------------------------------------- contested set


class ContestedConfig(dg.Config):
    """The contested-set rule (conductor_pipeline.calibration.ContestedRule) and the size floor."""

    weak: str | None = Field(None, description="Weak worker; empty: the pool's worst by marginal accuracy")
    strong: str | None = Field(None, description="Strong worker; empty: the pool's best by marginal accuracy")
    band_low: float = Field(BAND_LOW, ge=0, le=1, description="Contested if some worker's pass rate is <= this ...")
    band_high: float = Field(BAND_HIGH, ge=0, le=1, description="... and some worker's is >= this")
    confidence: float = Field(0.95, gt=0, lt=1, description="Confidence of the Wilson intervals that must separate")
    min_size: int = Field(
        DEFAULT_MIN_CONTESTED, ge=0, description="The size check fails below this ('200 steps over 33 questions is memorisation')"
    )


def _flip_table(flips: Mapping[str, int] | None) -> dg.MetadataValue:
    if flips is None:
        return dg.MetadataValue.text(NO_FLIPS_NOTE)
    rows = sorted(flips.items())
    return dg.MetadataValue.md(tabulate(rows, headers=["one-sample -> k-sample class", "questions"], tablefmt="github"))


@dg.asset(group_name=GROUP, deps=[pass_rates], kinds={"parquet"})
def contested_set(
    context: dg.AssetExecutionContext, config: ContestedConfig, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """Train-split questions that carry a routing decision, re-computed from the cached probes (no new calls)."""
    pool_config = pool.load()
    store = warehouse.get_warehouse()
    workers = pool_config.worker_names
    rates = _train_pass_rates(store, pool_config)
    if rates.is_empty():
        raise dg.Failure(f"no train-split probe pass rates for pool {pool_config.name!r}: materialize pass_rates first")
    first = train_split_rows(store.query_file("first_probe_samples", {"pool": pool_config.name}), workers)
    rule = ContestedRule(
        weak=config.weak, strong=config.strong, band_low=config.band_low, band_high=config.band_high,
        confidence=config.confidence,
    )
    try:
        selection = select_contested(rates, rule, first_samples=first)
    except ValueError as exc:
        raise dg.Failure(str(exc)) from exc
    leaked = [q for q in selection.question_ids if split_of(q) != "train"]
    if leaked:
        raise dg.Failure(f"contested set would leak {len(leaked)} eval-split questions, e.g. {leaked[:3]}")

    table_path, manifest_path = _contested_paths(warehouse, pool_config.name)
    chosen = selection.questions
    chosen.write_parquet(table_path)
    histogram = pass_rate_histogram(rates)
    manifest = {
        "pool": pool_config.name,
        "rule": rule.as_dict(),
        "weak": selection.weak,
        "strong": selection.strong,
        "min_size": config.min_size,
        "size": chosen.height,
        "counts": selection.counts,
        "one_sample_flips": selection.one_sample_flips,
        "split_fingerprint": split_fingerprint(),
        "question_ids": selection.question_ids,
        "dagster_run_id": context.run_id,
    }
    write_json_atomic(manifest_path, manifest)
    reasons = chosen.group_by("reason").len().sort("reason")
    samples = rates["samples"]
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
            "counts_per_class": dg.MetadataValue.md(
                tabulate(list(selection.counts.items()), headers=["class", "questions"], tablefmt="github")
            ),
            "counts_per_reason": dg.MetadataValue.md(tabulate(reasons.rows(), headers=["reason", "questions"], tablefmt="github")),
            "one_sample_flips": _flip_table(selection.one_sample_flips),
            "pool_mean_pass_rate_histogram": dg.MetadataValue.md(
                tabulate(histogram.rows(), headers=histogram.columns, tablefmt="github")
            ),
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
    manifest = read_contested_manifest(warehouse, pool.load().name)
    size, floor = int(manifest["size"]), int(manifest["min_size"])
    return dg.AssetCheckResult(
        passed=size >= floor,
        metadata={"size": size, "min_size": floor, "weak": manifest["weak"], "strong": manifest["strong"]},
        description=f"{size} contested questions; at least {floor} required",
    )


# ---------------------------------------------------------------------------- warm start


async def _sample(model_path: Path | str, rows: Sequence[dict], samples: int, max_new_tokens: int) -> list[tuple[dict, str]]:
    """`samples` completions per row at temperature 1 (the rollout temperature), seeded per row."""
    policy = HFLocalPolicy(model_path)
    texts = []
    try:
        for index, row in enumerate(rows):
            outputs = await policy.propose(row["prompt"], n=samples, temperature=1.0, max_new_tokens=max_new_tokens, seed=index)
            texts += [(row, out.text) for out in outputs]
    finally:
        await policy.aclose()
    return texts


def parse_check(model_path: Path | str, rows: Sequence[dict], naming: str, max_new_tokens: int, samples: int) -> tuple[float, dict[str, int]]:
    """(share of sampled completions that parse, count per parse code) at temperature 1, each
    completion parsed against the workers its prompt showed."""
    texts = asyncio.run(_sample(model_path, rows, samples, max_new_tokens))
    codes = Counter(parse_code(text, displayed_worker_names(row["workers"], naming)) for row, text in texts)
    return (codes[PARSE_OK] / len(texts) if texts else 0.0), dict(codes.most_common())


def _audit_skipped(
    model_path: Path | str, training: TrainingSet, executor: PoolExecutor, trainer: TrainerResource, settings: GRPOSettings
) -> dict[str, object] | None:
    """Sample the policy on a few skipped questions (no gradient) and audit the skip against their rewards."""
    sample = training.skipped[: trainer.prune_audit_questions]
    if not sample:
        return None
    rows = _prompt_rows(sample, training.pool_config, trainer, settings, training.anchors)

    async def rollouts() -> None:
        for row, text in await _sample(model_path, rows, settings.num_generations, settings.max_completion_length):
            await executor(text, row)

    asyncio.run(rollouts())
    rewards = executor.observed_rewards(settings.reward_variant)
    audit = audit_pruning(sample, {q.question_id: rewards.get(q.question_id, []) for q in sample})
    return {"sampled": len(sample), "observed": audit.observed, "really_zero_variance": audit.really_zero_variance,
            "precision": audit.precision, "describe": audit.describe()}


def _flat_groups(rewards: Mapping[str, Sequence[float]]) -> dict[str, int]:
    """How many questions' observed rewards were all equal, of those with at least two."""
    observed = [r for r in rewards.values() if len(r) >= 2]
    return {"observed": len(observed), "zero_variance": sum(1 for r in observed if max(r) - min(r) < 1e-9)}


@dg.asset(group_name=GROUP, deps=[contested_set], pool=GPU_POOL, kinds={"pytorch"})
def warm_start_policy(
    context: dg.AssetExecutionContext, trainer: TrainerResource, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """The policy GRPO starts from: SFT on synthetic valid workflows over the pool's workers (format only)."""
    training = _training_set(warehouse, pool, trainer)
    pool_config = training.pool_config
    settings = trainer.grpo_settings()
    started = time.monotonic()
    base = trainer.base_policy_path()
    # Exactly the GRPO prompts (same sub-pools, naming, examples): the format learnt is the one scored.
    rows = _prompt_rows(training.questions, pool_config, trainer, settings, training.anchors)
    check_rows = rows[:PARSE_CHECK_PROMPTS]
    n_checked = len(check_rows) * PARSE_CHECK_SAMPLES
    before, codes_before = parse_check(base, check_rows, trainer.naming, settings.max_completion_length, PARSE_CHECK_SAMPLES)
    context.log.info(f"base policy {base}: parse rate {before:.2f} on {n_checked} samples")
    metadata: dict[str, dg.MetadataValue] = {
        "base_policy": dg.MetadataValue.text(str(base)),
        "parse_rate_before": dg.MetadataValue.float(before),
        "parse_codes_before": dg.MetadataValue.json(codes_before),
        "parse_check": dg.MetadataValue.text(f"{len(check_rows)} prompts x {PARSE_CHECK_SAMPLES} samples, temperature 1"),
        **training.pruning_metadata(),
    }
    if not trainer.sft_warm_start:
        context.log.info("warm start disabled: GRPO starts from the base policy")
        return dg.MaterializeResult(metadata={**metadata, "model_path": dg.MetadataValue.path(str(base)), "warm_start": False})
    style = trainer.warm_start_style
    pairs = warm_start_pairs(rows, n=trainer.sft_examples, seed=settings.seed + 1, naming=trainer.naming, style=style)
    sft = trainer.sft_settings()
    context.log.info(f"warm start: {len(pairs)} synthetic pairs ({style} style), {sft.max_steps} SFT steps")
    sft_started = time.monotonic()
    out = warm_start_sft(base, pairs, sft, trainer.warm_start_dir(pool_config.name))
    sft_elapsed = time.monotonic() - sft_started
    after, codes_after = parse_check(out, check_rows, trainer.naming, settings.max_completion_length, PARSE_CHECK_SAMPLES)
    history_path = out / SFT_LOG_HISTORY
    history = json.loads(history_path.read_text()) if history_path.is_file() else []
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
        sft_steps=dg.MetadataValue.int(sft.max_steps),
        final_loss=dg.MetadataValue.float(float(next((h["loss"] for h in reversed(history) if "loss" in h), float("nan")))),
        sft_elapsed_s=dg.MetadataValue.float(round(sft_elapsed, 1)),
        elapsed_s=dg.MetadataValue.float(round(elapsed, 1)),
    )
    png = sft_loss_png(history)
    if png is not None:
        metadata["loss_curve"] = png_markdown(png, "SFT loss")
    return dg.MaterializeResult(metadata=metadata)


# ---------------------------------------------------------------------------- probe and gate


def read_probe_manifest(trainer: TrainerResource, pool_name: str) -> dict | None:
    path = trainer.probe_dir(pool_name) / PROBE_MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


@dg.asset(group_name=GROUP, deps=[contested_set, warm_start_policy], pool=GPU_POOL, kinds={"pytorch", "duckdb"})
def grpo_probe_run(
    context: dg.AssetExecutionContext, trainer: TrainerResource, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """A short GRPO run (default 20 steps) on the contested set: does a group's reward ever vary?"""
    training = _training_set(warehouse, pool, trainer)
    pool_config, store = training.pool_config, training.store
    settings = trainer.grpo_settings(steps=trainer.probe_steps)
    probe_run_id = f"probe-{pool_config.name}-{context.run_id[:8]}"
    output_dir = trainer.probe_dir(pool_config.name) / probe_run_id
    started = time.monotonic()
    executor = PoolExecutor(pool_config, pool.build_workers(), [*training.questions, *training.skipped], trainer.naming,
                            _bonus_predictor(trainer, warehouse, pool_config))
    outcome = _run_grpo(
        context, training=training, executor=executor, trainer=trainer,
        settings=settings, output_dir=output_dir, run_id=probe_run_id, phase="probe", resume=False,
    )
    elapsed = time.monotonic() - started
    observed = executor.observed_rewards(settings.reward_variant)
    pruning = None
    if training.pruning is not None:
        # The kept questions' flat share (from the probe) next to the skipped ones' (sampled for the audit).
        audit = _audit_skipped(trainer.start_policy_path(pool_config.name), training, executor, trainer, settings)
        pruning = {**training.pruning, "kept_observed": _flat_groups(observed), "skipped_audit": audit}
        context.log.info(f"world-model pruning: {pruning}")
    # The probe's weights are not a product: keep its logs, drop the checkpoints (GBs on the GPU profile).
    for checkpoint in output_dir.glob("checkpoint-*"):
        shutil.rmtree(checkpoint, ignore_errors=True)
    steps = [
        {"step": s["step"], "frac_zero_std": s["frac_zero_std"], "frac_groups_no_signal": s["frac_groups_no_signal"]}
        for s in outcome.steps
    ]
    manifest = {
        "probe_run_id": probe_run_id,
        "dagster_run_id": context.run_id,
        "group_size": settings.num_generations,
        "groups_per_step": settings.questions_per_step,
        "steps": steps,
        "contested_questions": len(training.questions) + len(training.skipped),
        "trained_questions": len(training.questions),
        "world_model_pruning": pruning,
    }
    manifest_path = trainer.probe_dir(pool_config.name) / PROBE_MANIFEST
    write_json_atomic(manifest_path, manifest)
    preview = evaluate_zero_variance(
        steps, probe_run_id=probe_run_id, group_size=settings.num_generations,
        groups_per_step=settings.questions_per_step, threshold=trainer.zero_variance_threshold,
    )
    context.log.info(f"probe {probe_run_id}: {outcome.global_step} steps in {elapsed:.0f}s; {preview.describe()}")
    last = outcome.steps[-1] if outcome.steps else {}
    summary = (
        f"{outcome.global_step} probe steps in {elapsed:.0f}s: {preview.figure:.3f} of {preview.groups} groups "
        f"(group size {settings.num_generations}; the paper's is 64) had zero reward variance; the gate needs "
        f"< {trainer.zero_variance_threshold:.2f}. Last step: reward {_fmt(last.get('reward_mean'))}, "
        f"parse failures {_fmt(last.get('parse_fail_rate'))}"
    )
    return dg.MaterializeResult(
        metadata={
            "summary": dg.MetadataValue.text(summary),
            "probe_run_id": dg.MetadataValue.text(probe_run_id),
            "zero_variance_fraction": dg.MetadataValue.float(preview.figure),
            "group_size": dg.MetadataValue.int(settings.num_generations),
            "groups": dg.MetadataValue.int(preview.groups),
            "threshold": dg.MetadataValue.float(trainer.zero_variance_threshold),
            "steps": dg.MetadataValue.int(outcome.global_step),
            "elapsed_s": dg.MetadataValue.float(round(elapsed, 1)),
            "seconds_per_step": dg.MetadataValue.float(round(elapsed / max(outcome.global_step, 1), 2)),
            "settings": dg.MetadataValue.json(settings.describe()),
            "contested_subpools": dg.MetadataValue.bool(trainer.contested_subpools),
            "world_model_pruning": dg.MetadataValue.json(pruning) if pruning else dg.MetadataValue.text("off"),
            **({"pruned_questions": dg.MetadataValue.int(len(training.skipped))} if pruning else {}),
            **_curve_metadata(
                store, probe_run_id, f"GRPO probe {probe_run_id} (group size {settings.num_generations})",
                trainer.probe_dir(pool_config.name) / f"{probe_run_id}.png", trainer.zero_variance_threshold,
            ),
        }
    )


def _probe_audit_metadata(manifest: Mapping | None) -> dict[str, dg.MetadataValue]:
    """The probe's audit of world-model pruning, repeated on the checkpoint it licensed."""
    audit = (manifest or {}).get("world_model_pruning")
    return {"probe_pruning_audit": dg.MetadataValue.json(audit)} if audit else {}


def _verdict_metadata(verdict: GateVerdict) -> dict[str, object]:
    return {
        "zero_variance_fraction": verdict.figure,
        "group_size": verdict.group_size,
        "groups": verdict.groups,
        "steps": verdict.steps,
        "threshold": verdict.threshold,
        "probe_run_id": verdict.probe_run_id,
    }


@dg.asset_check(
    asset=grpo_probe_run,
    blocking=True,
    description="Strictly fewer than the threshold (default 20%) of probe groups may have zero reward variance",
)
def zero_variance_gate(trainer: TrainerResource, warehouse: WarehouseResource, pool: PoolResource) -> dg.AssetCheckResult:
    """The gate: judged from the probe's `training_steps` rows; the verdict is persisted for later runs."""
    pool_name = pool.load().name
    manifest = read_probe_manifest(trainer, pool_name)
    if manifest is None:
        return dg.AssetCheckResult(passed=False, description="no probe run recorded")
    logged = warehouse.get_warehouse().query_file("training_steps_of_run", {"run_id": manifest["probe_run_id"]})
    no_signal = {s["step"]: s.get("frac_groups_no_signal") for s in manifest["steps"]}
    rows = [
        {"frac_zero_std": r["frac_zero_std"], "frac_groups_no_signal": no_signal.get(r["step"])}
        for r in logged.iter_rows(named=True)
    ]
    verdict = evaluate_zero_variance(
        rows, probe_run_id=manifest["probe_run_id"], group_size=manifest["group_size"],
        groups_per_step=manifest["groups_per_step"], threshold=trainer.zero_variance_threshold,
    )
    write_verdict(trainer.gate_path(pool_name), verdict)
    return dg.AssetCheckResult(passed=verdict.passed, metadata=_verdict_metadata(verdict), description=verdict.describe())


# ---------------------------------------------------------------------------- training


@dg.asset(group_name=GROUP, deps=[grpo_probe_run, contested_set], pool=GPU_POOL, kinds={"pytorch", "duckdb"})
def conductor_checkpoint(
    context: dg.AssetExecutionContext, trainer: TrainerResource, warehouse: WarehouseResource, pool: PoolResource
) -> dg.MaterializeResult:
    """GRPO of the conductor on the contested set: checkpoints every N steps, resumes from the latest."""
    pool_config = pool.load()
    manifest = read_probe_manifest(trainer, pool_config.name)
    try:
        verdict = require_open(read_verdict(trainer.gate_path(pool_config.name)), manifest and manifest["probe_run_id"])
    except GateClosedError as exc:
        raise dg.Failure(str(exc), metadata={"gate_path": str(trainer.gate_path(pool_config.name))}) from exc
    context.log.info(f"gate open: {verdict.describe()}")
    training = _training_set(warehouse, pool, trainer)
    store = training.store
    settings = trainer.grpo_settings()
    output_dir = trainer.checkpoint_dir(pool_config.name)
    run_id = f"grpo-{pool_config.name}"
    resume_step = _checkpoint_step(_last_checkpoint(output_dir))
    with store.connect() as con:  # steps a killed run logged past its last checkpoint are recomputed
        con.execute(load_sql("delete_training_steps_after"), {"run_id": run_id, "step": resume_step})
    started = time.monotonic()
    executor = PoolExecutor(pool_config, pool.build_workers(), training.questions, trainer.naming,
                            _bonus_predictor(trainer, warehouse, pool_config))
    outcome = _run_grpo(
        context, training=training, executor=executor, trainer=trainer,
        settings=settings, output_dir=output_dir, run_id=run_id, phase="grpo", resume=True,
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
            "elapsed_s": dg.MetadataValue.float(round(elapsed, 1)),
            "gate": dg.MetadataValue.json(_verdict_metadata(verdict)),
            "settings": dg.MetadataValue.json(settings.describe()),
            **training.pruning_metadata(),
            **_probe_audit_metadata(manifest),
            **_curve_metadata(
                store, run_id, f"GRPO {pool_config.name} (group size {settings.num_generations})",
                output_dir / "curves.png", trainer.zero_variance_threshold,
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
