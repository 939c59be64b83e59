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


@dataclass(frozen=True)
class SliceSpec:
    """Which questions an evaluation is about and how its slice is drawn: the one object that
    carries them from the asset's config (where their defaults and help live, `EvalArmsConfig`) to
    the slice, the cascades' population and the run id."""

    corpus: str
    splits: tuple[str, ...]
    math_levels: tuple[int, ...]
    size: int
    order: SliceOrder
    # Replay pools: draw only from questions every replay seat recorded.
    only_recorded: bool


def population(store: Warehouse, spec: SliceSpec) -> list[Question]:
    """Every question of the spec's corpus, splits and levels, train and eval side alike: what an
    eval is about (its slice is the eval side's; choices made for it read the train side's)."""
    return select_questions(store, corpora=[spec.corpus], splits=spec.splits, math_levels=spec.math_levels, limit=None)


def eval_candidates(store: Warehouse, workers: Mapping[str, Worker], spec: SliceSpec) -> tuple[list[Question], bool]:
    """The questions a slice may draw from, and whether they were restricted: with `only_recorded`,
    to what every replay seat recorded (when every worker is a replay seat)."""
    questions = population(store, spec)
    recorded = {name: w for name, w in workers.items() if isinstance(w, RecordedWorker)}
    if spec.only_recorded and recorded and len(recorded) == len(workers):
        ids = {name: frozenset(w.question_ids) for name, w in recorded.items()}
        covered = frozenset.intersection(*ids.values())
        candidates = [q for q in questions if q.question_id in covered]
        if questions and not candidates:
            raise UnrecordedSliceError(_uncovered_message(questions, ids, spec))
        return candidates, True
    return questions, False


class UnrecordedSliceError(ValueError):
    """No question of the eval's population was recorded by every replay seat of the pool."""


def _uncovered_message(questions: Sequence[Question], ids: Mapping[str, frozenset[str]], spec: SliceSpec) -> str:
    """Which seats leave the slice empty: each seat's recorded share of the population, fewest first."""
    where = f"{spec.corpus} (splits {list(spec.splits)}" + (
        f", levels {list(spec.math_levels)})" if spec.corpus == "math" else ")"
    )
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


@dataclass(frozen=True)
class DrawnSlice:
    """The eval slice's questions in order, the slice itself, and whether the population was
    restricted to what every replay seat recorded."""

    questions: tuple[Question, ...]
    slice: EvalSlice
    restricted_to_recorded: bool


def draw_slice(store: Warehouse, workers: Mapping[str, Worker], spec: SliceSpec) -> DrawnSlice:
    """The spec's slice of the questions `workers` can be evaluated on (`eval_candidates`, `eval_slice`)."""
    candidates, restricted = eval_candidates(store, workers, spec)
    chosen = eval_slice([q.question_id for q in candidates], spec.size, order=spec.order)
    by_id = {q.question_id: q for q in candidates}
    return DrawnSlice(tuple(by_id[qid] for qid in chosen.question_ids), chosen, restricted)


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
