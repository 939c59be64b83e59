"""Where the project extends TRL 1.16 beyond its public API: every such dependency is here.

1. The LM head on a CPU scores labelled positions only (`labelled_positions_only`). TRL 1.16 trains
   through `add_fused_lm_head`: it projects hidden states to log-probabilities in tiles; on Triton
   devices only the positions whose label is not -100, elsewhere every position (zeroing the ignored
   ones), so that compiled backends (XLA, Neuron) see one tile shape per batch. Eager CPU training has
   no such constraint, and a conductor sequence is mostly prompt, which carries no label in SFT or
   GRPO, so most of the head's work there is thrown away. It is TRL's own per-call choice, made "yes"
   for CPU tensors too.
2. GRPO with each group's prompt computed once, in sampling and in the loss (`SharedPromptGRPOTrainer`).
   A GRPO step samples `num_generations` completions of the same prompt, and a conductor prompt (the
   rules, the catalogue, the question: 500-700 tokens) is about 95% of each rollout's tokens. TRL's
   transformers path runs every rollout's prompt through the model twice, once to sample and once in
   the loss. Here sampling goes through TRL's `rollout_func` hook (`conductor.generation.sample_rows`
   runs each distinct prompt once), and the loss (`_get_per_token_logps_and_entropies`, the one method
   TRL computes log-probabilities in) runs each distinct prompt once, then only the completions after
   it, with the rows grouped by prompt: each layer's cache (`SharedPromptLayer`) hands a prompt's keys
   and values to its rows in one broadcast copy, and its backward sums the rows' gradients back into
   the one prompt computation (torch's own index and cat backward scatter element by element on a
   CPU, a quarter of the loss's time). Loss and gradients are TRL's own up to the order of float sums
   (a test checks, for whole groups and for a micro-batch holding part of some). It covers text-only prompts on the transformers path; anything else (images,
   vLLM, gradient checkpointing, which drops the prompt's cache, a repetition penalty) runs TRL's code.
3. A checkpoint saved outside the trainer's schedule (`save_checkpoint_now`: an early stop, a fault).
   transformers' `Trainer` (under TRL's) has no public call that writes a resumable checkpoint
   (weights, optimizer, scheduler, RNG and trainer state); `_save_checkpoint` is what its own
   schedule calls.

`SUPPORTED_TRL` is checked when the trainer is built, and a test fails on any other release.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from trl import GRPOTrainer

from conductor_pipeline.conductor.constrained import ConstrainedChooser, TokenTexts, grammars_of_prompts
from conductor_pipeline.conductor.generation import WarpedSampler, sample_rows

# The TRL release this module was written against (its GRPOTrainer internals are not an API).
SUPPORTED_TRL = "1.16."
# Rows per completion pass of the shared-prompt loss: passes of rows of similar length, each cut to
# its longest completion (fewer, wider passes pay for padding; more pay a pass's fixed cost).
ROWS_PER_COMPLETION_PASS = 32


def check_trl_version() -> None:
    """Refuse a TRL this extension was not written for, rather than train on a silently wrong path."""
    import trl

    if not trl.__version__.startswith(SUPPORTED_TRL):
        raise RuntimeError(
            f"conductor_pipeline.training.trl_extensions extends TRL {SUPPORTED_TRL}x internals, but TRL "
            f"{trl.__version__} is installed: re-check GRPOTrainer._get_per_token_logps_and_entropies and the "
            "rollout_func contract, or set share_prompt_prefix: false"
        )


@contextmanager
def labelled_positions_only() -> Iterator[None]:
    """Within this block, TRL's fused LM head on a CPU projects labelled positions only.

    TRL decides per call through `trl.trainer.utils._use_triton(device)` ("compact" scoring on
    Triton devices); the block answers yes for CPU tensors as well. On a TRL without that hook the
    block changes nothing. Other devices keep TRL's own answer.
    """
    import trl.trainer.utils as trl_utils

    decide = getattr(trl_utils, "_use_triton", None)
    if decide is None:
        yield
        return

    def compact_on_cpu(device) -> bool:
        return device.type == "cpu" or decide(device)

    trl_utils._use_triton = compact_on_cpu
    try:
        yield
    finally:
        trl_utils._use_triton = decide


def save_checkpoint_now(trainer: Any) -> None:
    """Write `checkpoint-<global step>` as the trainer's own save schedule would (extension 3)."""
    trainer._save_checkpoint(trainer.model, trial=None)


def shares_prompts(trainer: GRPOTrainer) -> bool:
    """Whether this trainer's setup is one the shared-prompt paths cover."""
    args = trainer.args
    return (
        not args.use_vllm
        and not args.gradient_checkpointing
        and not getattr(trainer, "_is_vlm", False)
        and (args.repetition_penalty or 1.0) == 1.0
        and not args.generation_kwargs
    )


def shared_prompt_rollout(prompts: list, trainer: GRPOTrainer) -> dict[str, Any]:
    """TRL's `rollout_func`: tokenize the prompts as TRL does and sample each after its shared prompt."""

    tokenizer = trainer.processing_class
    if prompts and isinstance(prompts[0], list):  # conversational: the chat template TRL applies
        prompt_ids = tokenizer.apply_chat_template(
            conversation=prompts, add_generation_prompt=True, tokenize=True, return_dict=True,
            **(trainer.args.chat_template_kwargs or {}),
        )["input_ids"]
    else:
        prompt_ids = tokenizer(text=prompts)["input_ids"]
    config = trainer.generation_config
    model = trainer.accelerator.unwrap_model(trainer.model)
    choose = WarpedSampler(config.temperature, config.top_k, config.top_p, config.min_p)
    if trainer.constrained_decoding:  # only workflows that parse against each prompt's catalogue
        grammars = grammars_of_prompts(prompts, trainer.aggregators, fan_outs_only=trainer.fan_outs_only)
        choose = ConstrainedChooser(choose, grammars, trainer.token_texts())
    with torch.no_grad():
        completions = sample_rows(
            model, prompt_ids, max_new_tokens=trainer.max_completion_length, pad_token_id=tokenizer.pad_token_id,
            stop_token_ids=trainer.eos_token_ids, device=str(trainer.accelerator.device), choose=choose,
        )
    return {"prompt_ids": [list(ids) for ids in prompt_ids], "completion_ids": completions, "logprobs": None}


class SharedPromptGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer whose loss runs each distinct prompt of a micro-batch through the model once.

    `constrained_decoding` samples only workflows that parse against the catalogue each prompt shows
    (`conductor.constrained`), the pool's vote seats (`aggregators`) only aggregating, and with
    `fan_outs_only` every multi-step workflow a fan-out they close; the loss scores them under the
    unconstrained policy, as TRL does with vLLM's structured outputs.
    """

    def __init__(
        self,
        *args: Any,
        constrained_decoding: bool = False,
        aggregators: Collection[str] = (),
        fan_outs_only: bool = False,
        **kwargs: Any,
    ):
        check_trl_version()
        super().__init__(*args, rollout_func=shared_prompt_rollout, **kwargs)
        self.constrained_decoding, self.aggregators = constrained_decoding, tuple(aggregators)
        self.fan_outs_only = fan_outs_only
        self._token_texts: TokenTexts | None = None
        if not shares_prompts(self):
            if constrained_decoding:
                raise ValueError("constrained decoding on the transformers path needs the shared-prompt sampler: "
                                 "this setup (vLLM, gradient checkpointing, generation_kwargs) does not share prompts")
            self.rollout_func = None  # TRL's own sampling; the loss below falls back too

    def token_texts(self) -> TokenTexts:
        """Each token's text under this trainer's tokenizer, built once."""
        if self._token_texts is None:
            self._token_texts = TokenTexts(self.processing_class, self.eos_token_ids)
        return self._token_texts

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **multimodal,
    ):
        if compute_aux_loss or not shares_prompts(self) or any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **multimodal,
            )
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            with self.accelerator.autocast():
                chunk_logps, chunk_entropy = completion_logps_after_shared_prompts(
                    model, input_ids[start:start + batch_size], attention_mask[start:start + batch_size], logits_to_keep
                )
            logps.append(chunk_logps)
            entropies.append(chunk_entropy)
        entropy = torch.cat(entropies, dim=0) if compute_entropy else None
        return torch.cat(logps, dim=0), entropy, None


def completion_logps_after_shared_prompts(model: Any, input_ids: Any, attention_mask: Any, completion_length: int):
    """Per-token log-probabilities (and entropies) of the last `completion_length` tokens of each row,
    from a TRL model with its fused LM head, with each distinct prompt (the rows' leading part, padded
    alike) run through the model once.

    The prompt's last token is fed with the completion, so the prompt pass stops one token short and
    the completion pass yields exactly one hidden state per completion token. Positions are the plain
    0..n-1 of TRL's own forward pass. The completions run in passes of `ROWS_PER_COMPLETION_PASS` rows
    of similar length, each cut to its longest completion (TRL pads every row to the batch's longest;
    a cut position has no label, so its log-probability is the zero TRL's head gives it). Within a
    pass the rows are grouped by prompt, so that each prompt's keys and values reach its rows as one
    broadcast copy (`SharedPromptLayer`). The outputs come back in the caller's row order.
    """
    prompt_length = input_ids.size(1) - completion_length
    prompts = torch.cat([input_ids[:, :prompt_length], attention_mask[:, :prompt_length]], dim=1)
    distinct, row_to_prompt = torch.unique(prompts, dim=0, return_inverse=True)
    cache = DynamicCache()
    model(
        input_ids=distinct[:, : prompt_length - 1], attention_mask=distinct[:, prompt_length : 2 * prompt_length - 1],
        cache=cache, use_cache=True, logits_to_keep=1,
    )
    prompt_states = [(layer.keys, layer.values) for layer in cache.layers]
    completion_mask = attention_mask[:, prompt_length:]
    positions = torch.arange(1, completion_length + 1, device=input_ids.device)
    lengths = (completion_mask * positions).amax(dim=1)  # up to each row's last unmasked token
    by_length = torch.argsort(lengths, stable=True)
    passes, pass_rows = [], []
    for start in range(0, input_ids.size(0), ROWS_PER_COMPLETION_PASS):
        rows = by_length[start:start + ROWS_PER_COMPLETION_PASS]
        rows = rows[torch.argsort(row_to_prompt[rows], stable=True)]
        width = max(int(lengths[rows].max()), 1)
        rows_per_prompt = torch.bincount(row_to_prompt[rows], minlength=distinct.size(0)).tolist()
        pass_cache = DynamicCache()
        pass_cache.layers = [SharedPromptLayer(keys, values, rows_per_prompt) for keys, values in prompt_states]
        ids, mask = input_ids[rows, : prompt_length + width], attention_mask[rows, : prompt_length + width]
        outputs = model(
            input_ids=ids[:, prompt_length - 1 : -1], attention_mask=mask[:, :-1], cache=pass_cache,
            shift_labels=ids[:, prompt_length:].masked_fill(mask[:, prompt_length:] == 0, -100), fused_lm_head=True,
        )
        cut = (0, completion_length - width)
        entropy = None if outputs.entropy is None else torch.nn.functional.pad(outputs.entropy, cut)
        passes.append((torch.nn.functional.pad(outputs.log_probs, cut), entropy))
        pass_rows.append(rows)
    caller_order = torch.argsort(torch.cat(pass_rows))
    log_probs = torch.cat([logps for logps, _ in passes])[caller_order]
    entropies = [entropy for _, entropy in passes]
    return log_probs, None if entropies[0] is None else torch.cat(entropies)[caller_order]


class RepeatPromptsThenAppend(torch.autograd.Function):
    """`cat([prompts.repeat_interleave(rows_per_prompt, 0), new], dim=-2)` in one copy, whose backward
    sums each prompt's rows (a plain index or cat backward on a CPU scatters element by element)."""

    @staticmethod
    def forward(ctx, prompts, new, rows_per_prompt):
        length = prompts.size(-2)
        out = new.new_empty(new.size(0), new.size(1), length + new.size(2), new.size(3))
        out[:, :, length:].copy_(new)
        for prompt, rows in zip(prompts, _row_ranges(rows_per_prompt)):
            out[rows, :, :length].copy_(prompt)
        ctx.length, ctx.rows_per_prompt = length, rows_per_prompt
        return out

    @staticmethod
    def backward(ctx, grad):
        length = ctx.length
        prompt_grad = torch.stack([grad[rows, :, :length].sum(0) for rows in _row_ranges(ctx.rows_per_prompt)])
        return prompt_grad, grad[:, :, length:], None


def _row_ranges(rows_per_prompt: list[int]) -> Iterator[slice]:
    start = 0
    for count in rows_per_prompt:
        yield slice(start, start + count)
        start += count


class SharedPromptLayer(DynamicLayer):
    """A key-value cache layer holding each distinct prompt once, for rows grouped by prompt: the
    completion pass's `update` returns, per row, its prompt's states followed by the row's own."""

    def __init__(self, prompt_keys: torch.Tensor, prompt_values: torch.Tensor, rows_per_prompt: list[int]):
        super().__init__()
        self.lazy_initialization(prompt_keys, prompt_values)
        self.keys, self.values = prompt_keys, prompt_values
        self.prompt_keys, self.prompt_values, self.rows_per_prompt = prompt_keys, prompt_values, rows_per_prompt

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        self.keys = RepeatPromptsThenAppend.apply(self.prompt_keys, key_states, self.rows_per_prompt)
        self.values = RepeatPromptsThenAppend.apply(self.prompt_values, value_states, self.rows_per_prompt)
        return self.keys, self.values
