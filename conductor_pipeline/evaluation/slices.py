"""The fixed eval slice and the train/eval leak checks."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from conductor_pipeline.splits import SplitLeakError, split_fingerprint, split_of

DEFAULT_SLICE_SIZE = 400  # the default: first 400 eval-split questions of the corpus
_LEAKS_SHOWN = 5

SliceOrder = Literal["question_id", "hashed"]


# ---------------------------------------------------------------------- the slice and the leak check


@dataclass(frozen=True)
class EvalSlice:
    """The questions an evaluation runs on, in order, with what it takes to reproduce them."""

    question_ids: tuple[str, ...]
    planned_size: int
    split_fingerprint: str
    order: SliceOrder = "question_id"

    @property
    def size(self) -> int:
        return len(self.question_ids)


def eval_slice(
    question_ids: Iterable[str], size: int = DEFAULT_SLICE_SIZE, *, order: SliceOrder = "question_id"
) -> EvalSlice:
    """The first `size` eval-split ids (train-split ids are never taken, whatever is passed)."""
    if size <= 0:
        raise ValueError(f"slice size must be positive, got {size}")
    if order not in ("question_id", "hashed"):
        raise ValueError(f"slice order must be 'question_id' or 'hashed', got {order!r}")
    eligible = {qid for qid in question_ids if split_of(qid) == "eval"}
    key = (lambda qid: hashlib.sha256(f"eval-order\x1f{qid}".encode()).hexdigest()) if order == "hashed" else None
    ordered = sorted(eligible, key=key)
    return EvalSlice(tuple(ordered[:size]), planned_size=size, split_fingerprint=split_fingerprint(), order=order)


def find_leaks(
    eval_ids: Iterable[str],
    *,
    training_ids: Iterable[str] = (),
    calibration_ids: Iterable[str] = (),
) -> dict[str, list[str]]:
    """Eval ids that were also used for training or calibration, or that sit on the train side."""
    evaluated = set(eval_ids)
    return {
        "training": sorted(evaluated & set(training_ids)),
        "calibration": sorted(evaluated & set(calibration_ids)),
        "train_split": sorted(qid for qid in evaluated if split_of(qid) != "eval"),
    }


def assert_no_leak(
    eval_ids: Iterable[str], *, training_ids: Iterable[str] = (), calibration_ids: Iterable[str] = ()
) -> None:
    """Raise SplitLeakError naming a few leaked ids per kind of leak."""
    leaks = find_leaks(eval_ids, training_ids=training_ids, calibration_ids=calibration_ids)
    problems = [
        f"{len(ids)} eval question(s) also in {kind}: {', '.join(ids[:_LEAKS_SHOWN])}"
        + (" ..." if len(ids) > _LEAKS_SHOWN else "")
        for kind, ids in leaks.items()
        if ids
    ]
    if problems:
        raise SplitLeakError("; ".join(problems))
