"""GRPO with TRL's GRPOTrainer: one row per optimizer step, checkpoints, resume after a kill.

What this relies on in TRL 1.16 (trl/trainer/grpo_trainer.py) and transformers' Trainer:
- Per-step log keys (logging_steps=1): `loss`, `learning_rate`, `reward`, `reward_std`,
  `frac_reward_zero_std`, `completions/mean_length`, `completions/clipped_ratio`, plus whatever the
  reward logged with `log_metric` (`conductor/...`); `step_row` maps them to canonical names.
- Resume: `train(resume_from_checkpoint=<dir>)` restores weights, optimizer, scheduler, RNG and
  `global_step`; a larger `max_steps` on the rerun continues the count.
- `DefaultFlowCallback` saves at `save_steps` multiples and at `max_steps`; an early stop (a callback
  setting `should_training_stop`) does not save by itself, so `train_grpo` does.
- A checkpoint is saved file by file (weights, optimizer, scheduler, RNG, `trainer_state.json` last)
  and `on_save` runs after the last one: that is where its manifest is written (every file's size
  and sha256, `CHECKPOINT_MANIFEST`). Only a checkpoint whose manifest verifies is resumed from or
  handed on; a folder killed mid-save, truncated later or damaged is skipped with a log line.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from conductor_pipeline.files import manifest_problem, write_failure, write_manifest
from conductor_pipeline.training.settings import GRPOSettings

logger = logging.getLogger(__name__)

# Written into a checkpoint folder once the Trainer has saved every file of it (`on_save`).
CHECKPOINT_MANIFEST = "checkpoint_manifest.json"
PREVIOUS_CHECKPOINT_KEPT = "the half-written folder was removed; the previous checkpoint is whole, and a rerun resumes from it"

# --- GRPO ------------------------------------------------------------------------------------

StepCallback = Callable[[dict], "bool | None"]


@dataclass
class TrainingOutcome:
    """Where a GRPO run ended: its last checkpoint, step, per-step rows and how it got there."""

    checkpoint_dir: Path | None
    global_step: int
    steps: list[dict]
    resumed_from: Path | None
    stopped_early: bool
    group_size: int


def step_row(global_step: int, logs: dict[str, Any], parse_counts: dict[str, int], group_size: int) -> dict:
    """One `training_steps`-shaped row from a TRL log dict (canonical names first, raw logs kept)."""
    return {
        "step": global_step,
        "reward_mean": logs.get("reward"),
        "reward_std": logs.get("reward_std"),
        "frac_zero_std": logs.get("frac_reward_zero_std"),
        "frac_groups_no_signal": logs.get("conductor/frac_groups_no_signal"),
        "frac_same_correctness": logs.get("conductor/frac_same_correctness"),
        "parse_fail_rate": logs.get("conductor/parse_fail_rate"),
        "infra_fail_rate": logs.get("conductor/infra_fail_rate"),
        "completion_length_mean": logs.get("completions/mean_length"),
        "clipped_ratio": logs.get("completions/clipped_ratio"),
        "loss": logs.get("loss"),
        "learning_rate": logs.get("learning_rate"),
        "group_size": group_size,
        "parse_code_counts": parse_counts,
        "trl_logs": dict(logs),
    }


def _make_callbacks(
    on_step: StepCallback | None,
    before_checkpoint: Callable[[], object] | None,
    reward_fn: Any,
    group_size: int,
    rows: list[dict],
    stop_flag: dict[str, bool],
):
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class StepRowCallback(TrainerCallback):
        """Turns each training log into a step row; `on_step` returning True stops (and saves).

        `step_seconds` is the wall time since the previous row (or the start of training): the
        whole step, including what `on_step` did for the previous one; `step_cpu_seconds` the CPU
        time this process spent in it (all threads), which a busy machine inflates far less.
        """

        last_row_at = time.perf_counter()
        last_cpu_at = time.process_time()

        def on_train_begin(self, args, state, control, **kwargs):
            self.last_row_at, self.last_cpu_at = time.perf_counter(), time.process_time()
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:  # skip the end-of-train summary log
                return control
            drain = getattr(reward_fn, "drain_counts", None)
            row = step_row(state.global_step, logs, drain() if drain else {}, group_size)
            now, cpu = time.perf_counter(), time.process_time()
            row["step_seconds"], row["step_cpu_seconds"] = now - self.last_row_at, cpu - self.last_cpu_at
            self.last_row_at, self.last_cpu_at = now, cpu
            rows.append(row)
            if on_step is not None and on_step(row):
                stop_flag["stopped"] = True
                control.should_training_stop = True
            if control.should_training_stop:
                control.should_save = True  # an early stop still leaves a checkpoint of this step
            if control.should_save:
                # the trainer saves right after this callback, into a folder that must start empty:
                # a half-written one left by a killed run must not lend its old files to the new save
                discard_checkpoint(Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
                if before_checkpoint is not None:
                    before_checkpoint()
            return control

        def on_save(self, args, state, control, **kwargs):
            seal_checkpoint(Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}", state.global_step)
            return control

    return [StepRowCallback()]


def seal_checkpoint(checkpoint: Path, global_step: int) -> Path:
    """Write the checkpoint's manifest (every file's size and sha256): from now on it is complete."""
    return write_manifest(checkpoint, CHECKPOINT_MANIFEST, {"global_step": global_step})


def discard_checkpoint(checkpoint: Path) -> None:
    """Remove a checkpoint folder that is about to be saved again or was left half-written."""
    if checkpoint.exists():
        logger.warning("removing %s before it is saved again (left by an interrupted save)", checkpoint)
        shutil.rmtree(checkpoint)


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why `checkpoint` is not a complete checkpoint (see `manifest_problem`), or None when it is."""
    return manifest_problem(checkpoint, CHECKPOINT_MANIFEST)


def last_checkpoint(output_dir: Path, log: Callable[[str], object] | None = None) -> Path | None:
    """The latest *complete* `checkpoint-N`: one whose manifest verifies (every file present, of its
    size and sha256).

    A process killed mid-save leaves a folder without a manifest; a later truncation or edit leaves
    one that does not verify. Resuming from either fails or, worse, trains on damaged weights, so
    they are skipped (saying why, to `log` or this module's logger) for the latest one that is whole;
    the rerun saves the skipped steps again.
    """
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    if not output_dir.is_dir():
        return None
    candidates = sorted(
        (path for path in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if path.name.rsplit("-", 1)[1].isdigit()),
        key=checkpoint_step, reverse=True,
    )
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        (log or logger.warning)(f"skipping checkpoint {path}: {problem}")
    return None


def remove_checkpoints(output_dir: Path) -> None:
    """Drop a run's `checkpoint-*` directories (weights that are not a product), keeping its logs."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    for checkpoint in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        shutil.rmtree(checkpoint, ignore_errors=True)


def checkpoint_step(checkpoint: Path | None) -> int:
    """The step a `checkpoint-N` directory holds; 0 for none."""
    return int(checkpoint.name.rsplit("-", 1)[1]) if checkpoint else 0


def _save_final_checkpoint(trainer: Any, output_dir: Path, before_checkpoint: Callable[[], object] | None) -> None:
    """Save and seal the trainer's current step outside its own save schedule (an early stop or a fault)."""
    from conductor_pipeline.training.trl_extensions import save_checkpoint_now

    final = output_dir / f"checkpoint-{trainer.state.global_step}"
    discard_checkpoint(final)
    if before_checkpoint is not None:
        before_checkpoint()
    try:
        save_checkpoint_now(trainer)
        seal_checkpoint(final, trainer.state.global_step)
    except Exception as exc:
        shutil.rmtree(final, ignore_errors=True)
        raise write_failure(final, "checkpoint", exc, PREVIOUS_CHECKPOINT_KEPT) from exc


def build_grpo_trainer(
    model_path: str | Path,
    prompts_dataset: Any,
    reward_fn: Callable,
    settings: GRPOSettings,
    output_dir: str | Path,
    *,
    callbacks: Sequence[Any] = (),
    aggregators: Sequence[str] = (),
):
    """TRL's GRPOTrainer for these settings (`SharedPromptGRPOTrainer` when they share prompts),
    on a left-padding tokenizer of the policy and the prompt rows as a dataset."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from conductor_pipeline.training.trl_extensions import SharedPromptGRPOTrainer

    dataset = prompts_dataset if isinstance(prompts_dataset, Dataset) else Dataset.from_list(list(prompts_dataset))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    common = {
        "model": str(model_path), "reward_funcs": [reward_fn], "train_dataset": dataset, "processing_class": tokenizer,
        "callbacks": list(callbacks), "peft_config": settings.peft_config(),
    }
    if settings.share_prompt_prefix:
        return SharedPromptGRPOTrainer(
            args=settings.to_grpo_config(output_dir), constrained_decoding=settings.constrained_decoding,
            aggregators=aggregators, fan_outs_only=settings.fan_outs_only, **common,
        )
    if not settings.constrained_decoding:
        return GRPOTrainer(args=settings.to_grpo_config(output_dir), **common)
    # GRPOSettings refuses constrained decoding without either sampler: this is vLLM's regex.
    regex = structured_outputs_regex(dataset)
    return GRPOTrainer(args=settings.to_grpo_config(output_dir, vllm_structured_outputs_regex=regex), **common)


def structured_outputs_regex(dataset: Any) -> str:
    """vLLM's structured-outputs regex for a dataset's prompts: one regex for all of them, so over the
    union of the names they show, up to the largest step limit."""
    from conductor_pipeline.conductor.constrained import workflow_regex
    from conductor_pipeline.conductor.prompt import shown_catalogue

    names: dict[str, None] = {}
    max_steps = 1
    for prompt in dict.fromkeys(str(row["prompt"][0]["content"]) for row in dataset):
        shown, steps = shown_catalogue([{"role": "system", "content": prompt}])
        names.update(dict.fromkeys(shown))
        max_steps = max(max_steps, steps)
    return workflow_regex(list(names), max_steps)


def train_grpo(
    model_path: str | Path,
    prompts_dataset: Any,
    reward_fn: Callable,
    settings: GRPOSettings,
    output_dir: str | Path,
    *,
    on_step: StepCallback | None = None,
    before_checkpoint: Callable[[], object] | None = None,
    resume: bool = True,
    max_steps_override: int | None = None,
    log: Callable[[str], object] | None = None,
    aggregators: Sequence[str] = (),
) -> TrainingOutcome:
    """Run GRPO with TRL's GRPOTrainer; resume from the latest `checkpoint-*`; always checkpoint.

    `prompts_dataset` is a `datasets.Dataset` or a list of rows with a conversational `prompt`
    (see `conductor_prompt_rows`). `on_step(row)` gets one row per optimizer step (see
    `step_row`); returning True stops the run early, which still saves a checkpoint.
    `before_checkpoint()` runs before every checkpoint is saved (e.g. to write what the steps up to
    it logged). An exception (including KeyboardInterrupt) saves the progress since the last
    checkpoint, then re-raises. A save that fails (a full disk) removes its half-written folder and
    raises `ArtifactWriteError` naming it; the previous checkpoint is untouched, so a rerun resumes
    from it. `log` gets the lines about checkpoints skipped as incomplete. `aggregators`: the pool's
    vote seats, for constrained decoding.
    """
    output_dir = Path(output_dir)
    if max_steps_override is not None:
        settings = replace(settings, max_steps=max_steps_override)
    if not resume:
        remove_checkpoints(output_dir)  # a fresh run: nothing an earlier attempt saved may pass for its own
    resumed_from = last_checkpoint(output_dir, log) if resume else None
    if resumed_from is not None and checkpoint_step(resumed_from) >= settings.max_steps:
        # A finished run: resuming would make the Trainer take one more step on every rerun.
        return TrainingOutcome(resumed_from, checkpoint_step(resumed_from), [], resumed_from, False, settings.num_generations)
    rows: list[dict] = []
    stop_flag = {"stopped": False}
    trainer = build_grpo_trainer(
        model_path, prompts_dataset, reward_fn, settings, output_dir,
        callbacks=_make_callbacks(on_step, before_checkpoint, reward_fn, settings.num_generations, rows, stop_flag),
        aggregators=aggregators,
    )
    from conductor_pipeline.training.trl_extensions import labelled_positions_only

    save_failed = False
    try:
        with labelled_positions_only():
            trainer.train(resume_from_checkpoint=str(resumed_from) if resumed_from else None)
    except BaseException as exc:
        saving = output_dir / f"checkpoint-{trainer.state.global_step}"
        if saving.exists() and checkpoint_problem(saving) is not None:  # it failed mid-save
            shutil.rmtree(saving, ignore_errors=True)  # half-written: never resumed from, never kept
            if isinstance(exc, Exception):
                save_failed = True
                raise write_failure(saving, "checkpoint", exc, PREVIOUS_CHECKPOINT_KEPT) from exc
        raise
    finally:
        # An early stop, a fault or a finish between save steps still leaves its last step on disk.
        if not save_failed and trainer.state.global_step > checkpoint_step(last_checkpoint(output_dir, log)):
            _save_final_checkpoint(trainer, output_dir, before_checkpoint)
    last = last_checkpoint(output_dir, log)
    return TrainingOutcome(
        checkpoint_dir=last,
        global_step=trainer.state.global_step,
        steps=rows,
        resumed_from=resumed_from,
        stopped_early=stop_flag["stopped"],
        group_size=settings.num_generations,
    )
