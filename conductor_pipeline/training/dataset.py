"""What GRPO trains on: the contested set's files, the questions they name, world-model pruning
(and its audit), and W's predictions for the reward bonus.

Only the *train* split (`conductor_pipeline.splits`) may enter: the contested set is refused if
it would leak an eval-split question, and its manifest is checked again when read (it is a file
that could be edited or built under another split).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from conductor_pipeline.conductor.hf_policy import HFLocalPolicy
from conductor_pipeline.conductor.prompt import Naming
from conductor_pipeline.devices import AUTO_DEVICE
from conductor_pipeline.files import read_json_checked, write_json_atomic, write_parquet_atomic
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat
from conductor_pipeline.pools.test_models import TestModelError, refuse_test_models
from conductor_pipeline.probing.contested import (
    ContestedRule,
    ContestedSelection,
    routing_anchors,
    select_contested,
)
from conductor_pipeline.probing.pass_rates import pass_rate_table
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_fingerprint, split_of, train_split_rows
from conductor_pipeline.training.rollouts import PoolExecutor, execute_samples, pool_prompt_rows, sample_completions
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.training.telemetry import PRUNE_AUDIT
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.data import load_training_frame
from conductor_pipeline.world_model.model import WorldModel
from conductor_pipeline.world_model.persistence import WorldModelFileError, load_world_model
from conductor_pipeline.world_model.prompts_and_pruning import (
    PRUNE_HIGH,
    PRUNE_LOW,
    audit_pruning,
    out_of_fold_prompt_success,
    prompt_predictor,
    prune_zero_variance,
)


class TrainingDataError(ValueError):
    """The training data cannot be assembled: a missing file, an eval-split leak, an empty set."""


# --- the contested set's files -----------------------------------------------------------------


def contested_set_paths(folder: Path, pool_name: str) -> tuple[Path, Path]:
    """(question table, manifest) of a pool's contested set."""
    return folder / f"{pool_name}.parquet", folder / f"{pool_name}.json"


def train_pass_rates(store: Warehouse, pool_config: PoolConfig) -> pl.DataFrame:
    """Train-split pass rates of the pool's workers (question_id, worker, samples, successes)."""
    return train_split_rows(pass_rate_table(store, pool_config.name), pool_config.worker_names).select(
        "question_id", "worker", "samples", "successes"
    )


def choose_contested_set(store: Warehouse, pool_config: PoolConfig, rule: ContestedRule) -> tuple[ContestedSelection, pl.DataFrame]:
    """(the contested selection, the train-split pass rates it was chosen from), from cached probes."""
    rates = train_pass_rates(store, pool_config)
    if rates.is_empty():
        raise TrainingDataError(f"no train-split probe pass rates for pool {pool_config.name!r}: materialize pass_rates first")
    first = train_split_rows(store.query_file("first_probe_samples", {"pool": pool_config.name}), pool_config.worker_names)
    if rule.corpora is not None:
        kept = questions_of_corpora(store, rates["question_id"].unique().to_list(), rule.corpora, pool_config.name)
        rates, first = rates.join(kept, on="question_id"), first.join(kept, on="question_id")
    try:
        selection = select_contested(rates, rule, first_samples=first)
    except ValueError as exc:
        raise TrainingDataError(str(exc)) from exc
    leaked = [q for q in selection.question_ids if split_of(q) != "train"]
    if leaked:
        raise TrainingDataError(f"contested set would leak {len(leaked)} eval-split questions, e.g. {leaked[:3]}")
    return selection, rates


def questions_of_corpora(store: Warehouse, question_ids: list[str], corpora: Sequence[str], pool_name: str) -> pl.DataFrame:
    """The ids (one column, `question_id`) among `question_ids` whose corpus is one of `corpora`;
    a corpus the pool was not probed on is refused, naming the ones it was."""
    probed = store.query_file("questions_by_ids", {"ids": question_ids}).select("question_id", "corpus")
    known = sorted(set(probed["corpus"].to_list()))
    unknown = sorted(set(corpora) - set(known))
    if unknown or not corpora:
        raise TrainingDataError(
            f"contested_set corpora {list(corpora)}: pool {pool_name!r} has train-split probes of {known} only"
        )
    return probed.filter(pl.col("corpus").is_in(list(corpora))).select("question_id")


def write_contested_set(
    folder: Path, pool_name: str, selection: ContestedSelection, rule: ContestedRule, *, min_size: int, run_id: str
) -> tuple[Path, Path]:
    """Write the question table and the manifest (rule, counts, question ids) the later steps read;
    returns their paths."""
    table_path, manifest_path = contested_set_paths(folder, pool_name)
    write_parquet_atomic(selection.questions, table_path, "contested-set table")
    manifest = {
        "pool": pool_name,
        "rule": rule.as_dict(),
        "weak": selection.weak,
        "strong": selection.strong,
        "min_size": min_size,
        "size": selection.questions.height,
        "counts": selection.counts,
        "one_sample_flips": selection.one_sample_flips,
        "split_fingerprint": split_fingerprint(),
        "question_ids": selection.question_ids,
        "dagster_run_id": run_id,
    }
    write_json_atomic(manifest_path, manifest)
    return table_path, manifest_path


def read_contested_manifest(folder: Path, pool_name: str) -> dict[str, Any]:
    """The contested set's manifest (rule, counts, question ids)."""
    _, manifest_path = contested_set_paths(folder, pool_name)
    if not manifest_path.is_file():
        raise TrainingDataError(f"no contested set for pool {pool_name!r} at {manifest_path}: materialize contested_set first")
    return read_json_checked(manifest_path, "contested-set manifest")


def contested_questions(store: Warehouse, manifest: Mapping[str, Any]) -> list[Question]:
    """The manifest's questions from the warehouse; refused if any is not train-split or missing."""
    ids = list(manifest["question_ids"])
    leaked = [q for q in ids if split_of(q) != "train"]
    if leaked:  # the manifest is a file: refuse one edited or built under another split
        raise TrainingDataError(f"{len(leaked)} contested questions are not in the train split (e.g. {leaked[:3]})")
    frame = store.query_file("questions_by_ids", {"ids": ids})
    if frame.height != len(ids):
        raise TrainingDataError(f"{len(ids) - frame.height} contested questions are missing from the questions table")
    return [Question(**row) for row in frame.iter_rows(named=True)]


# --- the training set ----------------------------------------------------------------------------


@dataclass
class TrainingSet:
    """What GRPO trains on: the contested questions (less any the world model pruned), per question
    the workers its random sub-pool must show (empty when sub-pools are unconstrained), and how the
    prompt shows the workers (naming, in-context examples)."""

    pool_config: PoolConfig
    store: Warehouse
    questions: list[Question]
    naming: Naming = "ordinal"
    n_examples: int = 0
    anchors: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    skipped: list[Question] = field(default_factory=list)
    pruning: dict[str, object] | None = None  # None: pruning off
    # question id -> {seat: W's out-of-fold P(success)} shown in the prompts; None: no numbers shown.
    predicted_success: dict[str, dict[str, float]] | None = None
    ranked: bool = False  # each sub-pool listed by those numbers, highest first

    def prompt_rows(self, settings: GRPOSettings, questions: Sequence[Question] | None = None) -> list[dict]:
        """The GRPO dataset rows of `questions` (default: the trained ones), sub-pools anchored."""
        return pool_prompt_rows(
            self.questions if questions is None else questions, self.pool_config, settings,
            naming=self.naming, n_examples=self.n_examples, anchors=self.anchors,
            predicted_success=self.predicted_success, ranked=self.ranked,
        )


def world_model_for(path: Path, knob: str) -> WorldModel:
    """The pool's world model, for a trainer knob that needs it (pruning, the reward bonus)."""
    try:
        return load_world_model(path)
    except WorldModelFileError as exc:
        raise TrainingDataError(f"{knob} is on but no world model can be used: {exc}") from exc


def build_training_set(
    store: Warehouse,
    pool_config: PoolConfig,
    contested_dir: Path,
    *,
    naming: Naming,
    n_examples: int,
    contested_subpools: bool,
    prune_with: Path | None = None,
    prune_low: float = PRUNE_LOW,
    prune_high: float = PRUNE_HIGH,
    show_predicted_success: bool = False,
    ranked_catalogue: bool = False,
) -> TrainingSet:
    """The contested questions of the pool, shown with `naming` and `n_examples`;
    `contested_subpools` anchors each question's sub-pools (`routing_anchors`); `prune_with` (a
    world model's path) drops questions it predicts every worker solves, or none does;
    `show_predicted_success` shows each catalogue line's out-of-fold W prediction
    (`out_of_fold_prompt_success`, from the train-split probes of the pool's seats) and
    `ranked_catalogue` lists each prompt's workers by it. A pool that seats a test model is refused.
    """
    try:
        refuse_test_models(pool_config)
    except TestModelError as exc:
        raise TrainingDataError(str(exc)) from exc
    if ranked_catalogue and not show_predicted_success:
        raise TrainingDataError("ranked_catalogue orders the workers by W's numbers: it needs show_predicted_success")
    questions = contested_questions(store, read_contested_manifest(contested_dir, pool_config.name))
    anchors = routing_anchors(train_pass_rates(store, pool_config)) if contested_subpools else {}
    shown = (
        out_of_fold_prompt_success(
            load_training_frame(store, pool=pool_config.name, probes_only=True), questions, pool_config.workers
        )
        if show_predicted_success else None
    )
    if prune_with is None:
        return TrainingSet(
            pool_config, store, questions, naming, n_examples, anchors, predicted_success=shown, ranked=ranked_catalogue
        )
    model = world_model_for(prune_with, "prune_with_world_model")
    kept, skipped = prune_zero_variance(model, questions, pool_config.workers, low=prune_low, high=prune_high)
    if not kept:
        raise TrainingDataError(
            f"the world model at {prune_with} pruned all {len(questions)} contested questions: nothing to train on"
        )
    summary = {
        "world_model": str(prune_with), "low": prune_low, "high": prune_high,
        "contested": len(questions), "kept": len(kept), "skipped": len(skipped),
    }
    return TrainingSet(
        pool_config, store, kept, naming, n_examples, anchors, skipped, summary, predicted_success=shown,
        ranked=ranked_catalogue,
    )


def bonus_predictor(
    weight: float, world_model_path: Path, seats: Sequence[WorkerSeat] | Mapping[str, WorkerSeat]
) -> Callable[[Question], dict[str, float]] | None:
    """W's per-worker P(success) for the reward bonus; None while the bonus is off (weight 0, the default)."""
    if weight == 0:
        return None
    return prompt_predictor(world_model_for(world_model_path, "world_model_bonus_weight"), seats)


# --- auditing the pruning ----------------------------------------------------------------------


def flat_groups(rewards: Mapping[str, Sequence[float]]) -> dict[str, int]:
    """How many questions' observed rewards were all equal, of those with at least two."""
    observed = [r for r in rewards.values() if len(r) >= 2]
    return {"observed": len(observed), "zero_variance": sum(1 for r in observed if max(r) - min(r) < 1e-9)}


def audit_skipped(
    model_path: Path | str,
    training: TrainingSet,
    executor: PoolExecutor,
    settings: GRPOSettings,
    max_questions: int,
    device: str = AUTO_DEVICE,
) -> dict[str, object] | None:
    """Sample the policy (on `device`) on a few skipped questions (no gradient) and audit the skip
    against their rewards."""
    sample = training.skipped[:max_questions]
    if not sample:
        return None
    rows = training.prompt_rows(settings, sample)

    async def rollouts() -> None:
        policy = HFLocalPolicy(model_path, device=device)
        try:
            sampled = await sample_completions(policy, rows, settings.num_generations, settings.max_completion_length)
        finally:
            await policy.aclose()
        await execute_samples(executor, sampled)

    probe_log = executor.log
    if probe_log is not None:  # filed under the probe's run, as its audit
        executor.log = replace(probe_log, phase=PRUNE_AUDIT)
    try:
        asyncio.run(rollouts())
        executor.write_rows()
    finally:
        executor.log = probe_log
    rewards = executor.observed_rewards(settings.reward_variant)
    audit = audit_pruning(sample, {q.question_id: rewards.get(q.question_id, []) for q in sample})
    return {"sampled": len(sample), "observed": audit.observed, "really_zero_variance": audit.really_zero_variance,
            "precision": audit.precision, "describe": audit.describe()}


def pruning_report(
    model_path: Path | str,
    training: TrainingSet,
    executor: PoolExecutor,
    settings: GRPOSettings,
    max_questions: int,
    device: str = AUTO_DEVICE,
) -> dict[str, object] | None:
    """After a probe: the pruning summary with the kept questions' flat share (observed by the
    probe) next to an audit of the skipped ones (sampled now, on `device`); None while pruning is off."""
    if training.pruning is None:
        return None
    kept_observed = flat_groups(executor.observed_rewards(settings.reward_variant))  # before the audit adds its own
    audit = audit_skipped(model_path, training, executor, settings, max_questions, device)
    return {**training.pruning, "kept_observed": kept_observed, "skipped_audit": audit}
