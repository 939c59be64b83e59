"""Rollouts: the GRPO prompt rows (randomised sub-pools) and executing sampled workflows."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

# --- prompts: the training dataset and randomised pools ------------------------------------


def conductor_prompt_rows(
    questions: Sequence[Any],
    workers: Sequence[str],
    build_messages: Callable[[Any, Sequence[str]], list[dict]],
    *,
    randomize_pools: bool = False,
    min_pool_size: int = 2,
    seed: int = 0,
    question_id: Callable[[Any], str] = lambda q: q.question_id,
    must_show: Callable[[Any], Sequence[Sequence[str]]] | None = None,
) -> list[dict]:
    """One GRPO dataset row per question: `prompt` (chat messages), `question_id`, `workers`.

    With `randomize_pools` (the paper), each question shows a random subset of the pool (at least
    `min_pool_size` workers, order shuffled), so the policy learns to route over unseen pools;
    `workers` records exactly what that prompt displayed, which the reward's parser must use.
    `must_show(question)` gives groups of workers; each random subset then holds one worker of
    every (non-empty) group, e.g. (solvers, failers) so that a contested question stays contested
    in the sub-pool it is shown with (see `routing_anchors`).
    """
    rng = random.Random(seed)
    rows = []
    for question in questions:
        shown = list(workers)
        if randomize_pools and len(shown) > min_pool_size:
            size = rng.randint(min_pool_size, len(shown))
            if must_show is None:
                shown = rng.sample(shown, size)
            else:
                anchors: list[str] = []
                for group in must_show(question):
                    options = [w for w in group if w in shown and w not in anchors]
                    if options:
                        anchors.append(rng.choice(options))
                rest = [w for w in shown if w not in anchors]
                shown = anchors[:size] + rng.sample(rest, max(0, size - len(anchors)))
                rng.shuffle(shown)  # anchors at fixed positions would teach position, not routing
        rows.append(
            {"prompt": build_messages(question, shown), "question_id": question_id(question), "workers": shown}
        )
    return rows
