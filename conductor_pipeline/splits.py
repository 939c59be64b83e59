"""The project's one train/eval split of question ids: a pure function of the id.

A question's side is decided by sha256(salt + id), so every machine, process and rerun
agrees without storing a list, and a question never moves when others are added. Training
(calibration, world model, GRPO) reads `train`, evaluation reads `eval`; assets record
`split_fingerprint()` so a table built under another salt or fraction is recognisable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable
from typing import Literal

import polars as pl

SplitName = Literal["train", "eval"]

DEFAULT_EVAL_FRACTION = 0.5
# Changing the salt reshuffles every question: bump the version only on purpose.
DEFAULT_SALT = "coryphaeus-split-v1"
# 64 bits of the digest give a uniform draw far finer than any fraction anyone will use.
_DRAW_BYTES = 8
_FINGERPRINT_HEX_CHARS = 12


class SplitLeakError(AssertionError):
    """The same question id is on both sides of the split."""


def _check_fraction(eval_fraction: float) -> None:
    if not 0.0 <= eval_fraction <= 1.0:
        raise ValueError(f"eval_fraction must be within [0, 1], got {eval_fraction}")


def split_of(
    question_id: str, *, eval_fraction: float = DEFAULT_EVAL_FRACTION, salt: str = DEFAULT_SALT
) -> SplitName:
    """`"eval"` for about `eval_fraction` of ids, `"train"` for the rest; stable everywhere."""
    _check_fraction(eval_fraction)
    digest = hashlib.sha256(f"{salt}{question_id}".encode()).digest()
    draw = int.from_bytes(digest[:_DRAW_BYTES], "big") / float(1 << (8 * _DRAW_BYTES))
    return "eval" if draw < eval_fraction else "train"


def split_ids(
    question_ids: Iterable[str],
    *,
    eval_fraction: float = DEFAULT_EVAL_FRACTION,
    salt: str = DEFAULT_SALT,
) -> tuple[list[str], list[str]]:
    """(train ids, eval ids), each in input order."""
    train: list[str] = []
    evaluation: list[str] = []
    for question_id in question_ids:
        side = split_of(question_id, eval_fraction=eval_fraction, salt=salt)
        (evaluation if side == "eval" else train).append(question_id)
    return train, evaluation


def split_fingerprint(
    *, eval_fraction: float = DEFAULT_EVAL_FRACTION, salt: str = DEFAULT_SALT
) -> str:
    """A short hash naming this split (salt and fraction), to record next to every asset built on it."""
    _check_fraction(eval_fraction)
    digest = hashlib.sha256(f"{salt}|{float(eval_fraction)!r}".encode()).hexdigest()
    return digest[:_FINGERPRINT_HEX_CHARS]


def train_split_rows(
    frame: pl.DataFrame, workers: Collection[str], *, split_fn: Callable[[str], str] = split_of
) -> pl.DataFrame:
    """The rows of `workers` on TRAIN-split questions only (each question id hashed once).

    Whatever learns from outcomes (W, best-single choice, the contested set, GRPO) must never
    have seen an eval question: its results there would be memory, not prediction.
    """
    ids = frame["question_id"].unique().to_list()
    train_ids = [qid for qid in ids if split_fn(qid) == "train"]
    return frame.filter(pl.col("question_id").is_in(train_ids) & pl.col("worker").is_in(list(workers)))
