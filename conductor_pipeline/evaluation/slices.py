"""The fixed eval slice, the questions it may draw from, and the train/eval leak checks."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from conductor_pipeline.pools.backends.base import RecordedWorker, Worker
from conductor_pipeline.probing.runner import select_questions
from conductor_pipeline.records import Question
from conductor_pipeline.splits import SplitLeakError, split_fingerprint, split_of
from conductor_pipeline.warehouse import Warehouse

# The first 400 eval-split questions of the corpus: a 95% interval of about +-5 points at 50%.
DEFAULT_SLICE_SIZE = 400
# Every evaluation run id starts with this, so training-question queries can tell runs apart.
EVAL_RUN_PREFIX = "eval-"
_LEAKS_SHOWN = 5

SliceOrder = Literal["question_id", "hashed"]


# ---------------------------------------------------------------------- the slice and the leak check


def population(store: Warehouse, *, corpus: str, splits: Sequence[str], math_levels: Sequence[int]) -> list[Question]:
    """Every question of the corpus's `splits` at `math_levels`, train and eval side alike: what an
    eval is about (its slice is the eval side's; choices made for it read the train side's)."""
    return select_questions(store, corpora=[corpus], splits=splits, math_levels=math_levels, limit=None)


def eval_candidates(
    store: Warehouse,
    workers: Mapping[str, Worker],
    *,
    corpus: str,
    splits: Sequence[str],
    math_levels: Sequence[int],
    only_recorded: bool = True,
) -> tuple[list[Question], bool]:
    """The questions a slice may draw from, and whether they were restricted: with `only_recorded`,
    to what every replay seat recorded (when every worker is a replay seat)."""
    questions = population(store, corpus=corpus, splits=splits, math_levels=math_levels)
    recorded = {name: w for name, w in workers.items() if isinstance(w, RecordedWorker)}
    if only_recorded and recorded and len(recorded) == len(workers):
        ids = {name: frozenset(w.question_ids) for name, w in recorded.items()}
        covered = frozenset.intersection(*ids.values())
        candidates = [q for q in questions if q.question_id in covered]
        if questions and not candidates:
            raise UnrecordedSliceError(_uncovered_message(questions, ids, corpus, splits, math_levels))
        return candidates, True
    return questions, False


class UnrecordedSliceError(ValueError):
    """No question of the eval's population was recorded by every replay seat of the pool."""


def _uncovered_message(
    questions: Sequence[Question], ids: Mapping[str, frozenset[str]], corpus: str, splits: Sequence[str],
    math_levels: Sequence[int],
) -> str:
    """Which seats leave the slice empty: each seat's recorded share of the population, fewest first."""
    where = f"{corpus} (splits {list(splits)}" + (f", levels {list(math_levels)})" if corpus == "math" else ")")
    counts = {name: sum(q.question_id in recorded for q in questions) for name, recorded in ids.items()}
    none = [name for name, n in counts.items() if n == 0]
    shares = ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda item: (item[1], item[0])))
    fix = (f"{', '.join(none)} recorded none of them: drop them from the pool file or evaluate another corpus"
           if none else "their recordings do not overlap: seat other workers or evaluate another corpus")
    return (f"no question of {where} was recorded by every replay seat; of its {len(questions)} questions "
            f"each seat recorded {shares}. {fix} (eval_arms config `corpus`)")


def training_question_ids(store: Warehouse, contested_manifest: str | Path | None = None) -> list[str]:
    """Every question a conductor was trained or run on outside evaluation: conductor calls logged
    outside eval runs, plus the questions of a contested-set manifest (the GRPO training questions),
    when one is given and exists."""
    ids = set(store.query_file("eval_training_questions", {"eval_prefix": EVAL_RUN_PREFIX})["question_id"].to_list())
    if contested_manifest and Path(str(contested_manifest)).is_file():
        ids.update(json.loads(Path(str(contested_manifest)).read_text()).get("question_ids", []))
    return sorted(ids)


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
