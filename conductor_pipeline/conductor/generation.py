"""Sampling a local causal LM on many prompt rows whose start is shared: the start runs once.

A conductor prompt is mostly its system message (the rules and the catalogue), and rollouts come
in groups: GRPO samples one prompt `num_generations` times, the eval asks 64 questions that share
one system message. `sample_rows` therefore

1. runs each *distinct* row once, and the tokens all distinct rows start with once for all of them
   (laid out as [shared start | left padding | own tokens], positions following the attention
   mask, so every row is computed as if alone);
2. copies that prefix into a preallocated cache of every row (a `StaticCache`: a decode step
   writes one column in place instead of concatenating the whole cache, which cost three times the
   step's attention);
3. decodes one token per step for the rows still running, and compacts the cache once half of
   its rows have stopped, so short workflows do not pay for the longest one.

How the next token is chosen is a `TokenChooser`: a sample from the warped distribution (what
`generate` draws), a seeded Gumbel-max sample per row (the eval: a row's text does not depend on
its batch), or the argmax; any of them restricted to the tokens that keep a workflow parseable
(`conductor.constrained.ConstrainedChooser`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# Compact the decode cache when at most this share of its rows is still running.
COMPACT_AT_SHARE = 0.5


@dataclass(frozen=True)
class PrefixLayout:
    """How rows map onto their distinct prompts, and how many tokens every distinct prompt starts with."""

    uniques: list[list[int]]
    row_to_unique: list[int]
    shared: int

    @classmethod
    def of(cls, rows: Sequence[Sequence[int]]) -> PrefixLayout:
        index: dict[tuple[int, ...], int] = {}
        row_to_unique = [index.setdefault(tuple(row), len(index)) for row in rows]
        uniques = [list(row) for row in index]
        return cls(uniques, row_to_unique, shared_prefix_length(uniques))


def shared_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every row has in common, leaving each row at least one of its own
    (decoding starts from a row's last prompt token)."""
    first, limit = rows[0], min(len(row) for row in rows) - 1
    length = 0
    while length < limit and all(row[length] == first[length] for row in rows):
        length += 1
    return length


class TokenChooser(Protocol):
    """Picks the next token of each running row from its logits (`rows`: the rows' indices in the batch)."""

    def __call__(self, logits: Any, rows: Any) -> Any: ...


class GreedyChooser:
    def __call__(self, logits: Any, rows: Any) -> Any:
        return logits.argmax(dim=-1)

    def scores(self, logits: Any, rows: Any) -> Any:
        """What the pick is the argmax of (a constrained chooser takes the best allowed one)."""
        return logits


class WarpedSampler:
    """A sample from the temperature / top-k / top-p / min-p warped distribution, from torch's
    global generator: what `generate(do_sample=True)` draws with the same settings."""

    def __init__(self, temperature: float, top_k: int | None = None, top_p: float | None = None, min_p: float | None = None):
        from transformers import (
            LogitsProcessorList,
            MinPLogitsWarper,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        if temperature <= 0:
            raise ValueError(f"a sampler needs a positive temperature, got {temperature}")
        warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
        if top_k:
            warpers.append(TopKLogitsWarper(top_k))
        if top_p is not None and top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
        if min_p:
            warpers.append(MinPLogitsWarper(min_p))
        self.warpers = warpers

    def __call__(self, logits: Any, rows: Any) -> Any:
        import torch

        scores = self.warpers(None, logits.float())
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)

    def scores(self, logits: Any, rows: Any) -> Any:
        """The warped logits plus Gumbel noise from torch's global generator: their argmax is a
        sample of the warped distribution, and their best allowed token one of it restricted."""
        import torch

        scores = self.warpers(None, logits.float())
        return scores + gumbel_noise(torch.rand(scores.shape, device=scores.device))


class SeededGumbelSampler:
    """A sample at `temperature` per row from a generator of its own (Gumbel-max over the scaled
    logits): exactly the softmax distribution, and a row's draws do not depend on the other rows."""

    def __init__(self, seeds: Sequence[int], temperature: float, device: str):
        import torch

        if temperature <= 0:
            raise ValueError(f"a sampler needs a positive temperature, got {temperature}")
        self.temperature = temperature
        self.generators = [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]

    def __call__(self, logits: Any, rows: Any) -> Any:
        return self.scores(logits, rows).argmax(dim=-1)

    def scores(self, logits: Any, rows: Any) -> Any:
        """The scaled logits plus each row's own Gumbel noise (their argmax is this sampler's pick)."""
        import torch

        uniform = torch.stack(
            [torch.rand(logits.shape[-1], generator=self.generators[row], device=logits.device) for row in rows.tolist()]
        )
        return logits.float() / self.temperature + gumbel_noise(uniform)


def gumbel_noise(uniform: Any) -> Any:
    """Standard Gumbel noise from uniform draws (clamped away from 0, whose log is -inf)."""
    import torch

    return -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float32).tiny)))


def sample_rows(
    model: Any,
    rows: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    pad_token_id: int,
    stop_token_ids: Sequence[int],
    choose: TokenChooser,
    device: str = "cpu",
) -> list[list[int]]:
    """The completion of each prompt row (token ids, up to and including its first stop token),
    decoded until every row stops or `max_new_tokens` are written. Call under `torch.no_grad()`."""
    import torch

    if not rows:
        return []
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    layout = PrefixLayout.of(rows)
    cache, width, mask = _prefill(model, layout, pad_token_id=pad_token_id, max_new_tokens=max_new_tokens, device=device)
    completions: list[list[int]] = [[] for _ in rows]
    stops = torch.tensor(list(stop_token_ids), device=device)
    # Per cache slot: the row it holds, whether that row is still running, its next input and position.
    slot_rows = torch.arange(len(rows), device=device)
    running = torch.ones(len(rows), dtype=torch.bool, device=device)
    last = torch.tensor([layout.uniques[u][-1] for u in layout.row_to_unique], device=device)
    position = torch.tensor([len(layout.uniques[u]) - 1 for u in layout.row_to_unique], device=device)
    for step in range(max_new_tokens):
        column = width + step  # the cache column this step writes (the cache's fill count)
        mask[:, column] = running
        logits = model(
            input_ids=last[:, None], attention_mask=mask, position_ids=position[:, None], cache=cache,
            use_cache=True, logits_to_keep=1,
        ).logits[:, -1]
        live = running.nonzero().squeeze(1)
        chosen = choose(logits.index_select(0, live), slot_rows.index_select(0, live))
        for row, token in zip(slot_rows.index_select(0, live).tolist(), chosen.tolist(), strict=True):
            completions[row].append(token)
        running[live[torch.isin(chosen, stops)]] = False
        last[live] = chosen
        position = position + 1
        if not bool(running.any()):
            break
        if int(running.sum()) <= COMPACT_AT_SHARE * len(running):
            keep = running.nonzero().squeeze(1)
            cache = _compact(model, cache, keep, filled=column + 1)
            mask, slot_rows, running, last, position = (t.index_select(0, keep) for t in (mask, slot_rows, running, last, position))
    return completions


def _prefill(
    model: Any, layout: PrefixLayout, *, pad_token_id: int, max_new_tokens: int, device: str
) -> tuple[Any, int, Any]:
    """Run every distinct prompt but its last token through the model (the shared start once) and
    copy the result into a static cache of every row; returns (cache, prompt width, attention mask
    over the whole cache)."""
    import torch
    from transformers import DynamicCache, StaticCache

    shared = layout.shared
    own = [u[shared:-1] for u in layout.uniques]
    own_width = max(len(tokens) for tokens in own)
    width = shared + own_width
    unique_mask = torch.tensor([[1] * shared + [0] * (own_width - len(t)) + [1] * len(t) for t in own], device=device)
    prefix = DynamicCache(config=model.config)
    if shared:
        start = torch.tensor([layout.uniques[0][:shared]], device=device)
        model(input_ids=start, cache=prefix, use_cache=True, logits_to_keep=1)
        prefix.batch_repeat_interleave(len(layout.uniques))
    if own_width:
        own_ids = torch.tensor([[pad_token_id] * (own_width - len(t)) + t for t in own], device=device)
        positions = (unique_mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        model(input_ids=own_ids, attention_mask=unique_mask, position_ids=positions, cache=prefix, use_cache=True, logits_to_keep=1)
    rows = torch.tensor(layout.row_to_unique, device=device)
    cache = StaticCache(config=model.config, max_cache_len=width + max_new_tokens)
    for index, layer in enumerate(prefix.layers):
        cache.update(layer.keys.index_select(0, rows), layer.values.index_select(0, rows), index)
    mask = torch.zeros(len(rows), width + max_new_tokens, dtype=torch.long, device=device)
    mask[:, :width] = unique_mask.index_select(0, rows)
    return cache, width, mask


def _compact(model: Any, cache: Any, keep: Any, *, filled: int) -> Any:
    """A static cache of only the `keep` slots, with their first `filled` columns."""
    from transformers import StaticCache

    compact = StaticCache(config=model.config, max_cache_len=cache.layers[0].max_cache_len)
    for index, layer in enumerate(cache.layers):
        compact.update(layer.keys[keep, :, :filled], layer.values[keep, :, :filled], index)
    return compact
