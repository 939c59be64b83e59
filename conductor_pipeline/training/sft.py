"""The supervised warm start: teach the policy the workflow format before GRPO."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from conductor_pipeline.files import write_json_atomic, write_text_atomic
from conductor_pipeline.training.settings import SFTSettings

# --- SFT warm start ----------------------------------------------------------------------------

SFT_MANIFEST = "sft_manifest.json"
SFT_LOG_HISTORY = "sft_log_history.json"


def _examples_digest(model_path: Path, examples: Sequence[tuple[list[dict], str]], settings: SFTSettings) -> str:
    digest = hashlib.sha256(json.dumps({"model": str(model_path), "settings": asdict(settings)}, sort_keys=True).encode())
    for messages, completion in examples:
        digest.update(json.dumps([messages, completion], sort_keys=True).encode())
    return digest.hexdigest()[:16]


def _completed_digest(manifest_path: Path) -> str | None:
    """The digest of the warm start whose manifest this is; None when absent or unreadable (redo it)."""
    try:
        return json.loads(manifest_path.read_text()).get("digest")
    except (OSError, ValueError, AttributeError):
        return None


def warm_start_sft(
    model_path: str | Path,
    examples: Sequence[tuple[list[dict], str]],
    settings: SFTSettings,
    output_dir: str | Path,
) -> Path:
    """Fine-tune `model_path` on (prompt messages, target workflow text) pairs; return the model dir.

    Uses TRL's SFTTrainer on a conversational prompt-completion dataset, so the loss covers the
    assistant turn only and the model learns to close it with its end-of-turn token. With LoRA
    (`settings.lora`), the adapters are merged into the saved weights. Idempotent:
    an output_dir whose manifest matches (model, examples, settings) is returned untouched. The
    trainer's log history (loss per step) is written next to the model.
    """
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    from conductor_pipeline.training.trl_extensions import labelled_positions_only

    model_path, output_dir = Path(model_path), Path(output_dir)
    if not examples:
        raise ValueError("warm_start_sft needs at least one example")
    digest = _examples_digest(model_path, examples, settings)
    manifest_path = output_dir / SFT_MANIFEST
    if _completed_digest(manifest_path) == digest:
        return output_dir
    # The manifest marks a complete model: drop it before any file is rewritten, so a run killed
    # mid-save leaves a folder that is retrained, never one whose old manifest vouches for new weights.
    manifest_path.unlink(missing_ok=True)

    dataset = Dataset.from_list(
        [
            {"prompt": list(messages), "completion": [{"role": "assistant", "content": completion}]}
            for messages, completion in examples
        ]
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    trainer = SFTTrainer(
        model=str(model_path),
        args=settings.to_sft_config(output_dir),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=settings.peft_config(),
    )
    with labelled_positions_only():
        trainer.train()
    if settings.peft_config() is None:
        trainer.save_model(str(output_dir))
    else:  # adapters merged: GRPO, the parse check and evaluation all read a plain model folder
        trainer.model.merge_and_unload().save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    write_text_atomic(output_dir / SFT_LOG_HISTORY, json.dumps(trainer.state.log_history, indent=1), "SFT log history")
    write_json_atomic(manifest_path, {"digest": digest, "base_model": str(model_path), "examples": len(examples)})
    return output_dir


def read_sft_history(model_dir: str | Path) -> list[dict]:
    """The trainer's log history a warm start wrote next to its model; empty when there is none."""
    path = Path(model_dir) / SFT_LOG_HISTORY
    return json.loads(path.read_text()) if path.is_file() else []


def final_loss(history: Sequence[dict]) -> float:
    """The last logged training loss; NaN when none was logged."""
    return float(next((h["loss"] for h in reversed(history) if "loss" in h), float("nan")))
