"""The fixed train/eval split: stable, proportional, salt-dependent, leak-checked."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor_pipeline.splits import (
    DEFAULT_SALT,
    SplitLeakError,
    split_fingerprint,
    split_ids,
    split_of,
)

_LEAKS_SHOWN = 5


def assert_disjoint(train_ids: Iterable[str], eval_ids: Iterable[str]) -> None:
    """Raise SplitLeakError naming a few ids that appear in both sets."""
    leaked = set(train_ids) & set(eval_ids)
    if leaked:
        shown = sorted(leaked)[:_LEAKS_SHOWN]
        more = f" and {len(leaked) - len(shown)} more" if len(leaked) > len(shown) else ""
        raise SplitLeakError(
            f"{len(leaked)} question ids are in both train and eval: {', '.join(shown)}{more}"
        )


IDS = [f"test/algebra/{k}.json" for k in range(2_000)] + [f"gsm8k:train:{k}" for k in range(2_000)]


def test_split_is_the_documented_function_of_salt_and_id():
    """Pinned to the definition, so a refactor that moved questions across machines would fail here."""
    for question_id in ("test/algebra/1143.json", "gsm8k:test:0", "train/geometry/377.json"):
        digest = hashlib.sha256(f"{DEFAULT_SALT}{question_id}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        assert split_of(question_id) == ("eval" if draw < 0.5 else "train")


@given(st.text(min_size=1, max_size=60), st.floats(0.0, 1.0))
def test_split_is_deterministic_and_monotone_in_the_fraction(question_id, fraction):
    side = split_of(question_id, eval_fraction=fraction)
    assert side == split_of(question_id, eval_fraction=fraction)
    # Growing the eval share only moves questions from train to eval, never back.
    if side == "eval":
        assert split_of(question_id, eval_fraction=min(1.0, fraction + 0.1)) == "eval"


def test_fraction_is_respected_and_extremes_are_exact():
    _, evaluation = split_ids(IDS)
    assert abs(len(evaluation) / len(IDS) - 0.5) < 0.03
    _, evaluation = split_ids(IDS, eval_fraction=0.2)
    assert abs(len(evaluation) / len(IDS) - 0.2) < 0.03
    assert split_ids(IDS, eval_fraction=0.0)[1] == []
    assert split_ids(IDS, eval_fraction=1.0)[0] == []
    with pytest.raises(ValueError, match="eval_fraction"):
        split_of("x", eval_fraction=1.5)


def test_salt_reshuffles_and_fingerprint_names_the_split():
    default = [split_of(q) for q in IDS[:500]]
    other = [split_of(q, salt="another-salt") for q in IDS[:500]]
    assert default != other
    fingerprint = split_fingerprint()
    assert fingerprint == split_fingerprint(eval_fraction=0.5, salt=DEFAULT_SALT)
    assert len(fingerprint) == 12 and int(fingerprint, 16) >= 0
    assert fingerprint != split_fingerprint(eval_fraction=0.3)
    assert fingerprint != split_fingerprint(salt="another-salt")
    assert split_fingerprint(eval_fraction=1) == split_fingerprint(eval_fraction=1.0)


def test_split_ids_partitions_in_input_order():
    train, evaluation = split_ids(IDS)
    assert sorted(train + evaluation) == sorted(IDS)
    assert train == [q for q in IDS if split_of(q) == "train"]
    assert_disjoint(train, evaluation)


def test_assert_disjoint_names_a_few_leaked_ids():
    train = [f"q{k}" for k in range(20)]
    evaluation = [f"q{k}" for k in range(10, 30)]
    with pytest.raises(SplitLeakError, match=r"10 question ids are in both") as caught:
        assert_disjoint(train, evaluation)
    message = str(caught.value)
    assert "q10" in message and "and 5 more" in message
    assert_disjoint(["a"], ["b"])
