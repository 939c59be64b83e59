"""The local conductor policy: a Hugging Face causal LM (the tiny CPU model, or a training checkpoint
on a GPU), sampled through the prefix-sharing generation of `conductor.generation`; and a local
model's identity by its weights (`model_digest`, `policy_fingerprint`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from conductor_pipeline.conductor.generation import GreedyChooser, SeededGumbelSampler, WarpedSampler, sample_rows
from conductor_pipeline.conductor.protocols import PolicyOutput
from conductor_pipeline.corpora.sources import sha256_of
from conductor_pipeline.devices import AUTO_DEVICE, cuda_index, resolve_device
from conductor_pipeline.records import stable_id

# Padded (prompt + completion) tokens one batched `generate` may hold: the key-value cache grows
# with it. 32k tokens is ~0.4 GiB of cache for a 0.5B model and ~2 GiB for a 7B one in bf16.
DEFAULT_MAX_BATCH_TOKENS = 32_768


# The files of a model folder that decide its outputs (weights and architecture), not training state.
MODEL_FILE_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "config.json")


def model_digest(model_dir: str | Path) -> str:
    """A digest of a local model's weights and config: the same folder retrained digests differently."""
    model_dir = Path(model_dir)
    files = sorted({path for pattern in MODEL_FILE_PATTERNS for path in model_dir.glob(pattern) if path.is_file()})
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no model weights ({', '.join(MODEL_FILE_PATTERNS)})")
    return stable_id(*(f"{path.name}={sha256_of(path)}" for path in files))


def policy_fingerprint(model: str | Path) -> str:
    """A policy by what it is: the digest of a local model's weights and config (`model_digest`),
    or the hub id / path as written when nothing local holds it."""
    return model_digest(model) if Path(str(model)).is_dir() else str(model)


class HFLocalPolicy:
    """A local transformers causal LM; the n samples of one prompt run as one batch.

    The model loads on first use (so building the policy is cheap, e.g. in a Dagster resource),
    and generation runs in a worker thread behind a lock so the event loop stays responsive and
    two prompts never share the model concurrently. `device` is resolved once, here
    (`resolve_device`: `auto` is a GPU when there is one). `constrained`: sample only workflows that
    parse against the catalogue each prompt shows (`conductor.constrained`), with the pool's vote
    seats (`aggregators`) only aggregating and, with `fan_outs_only`, closing every multi-step workflow.
    """

    def __init__(
        self, model_path: str | Path, device: str = AUTO_DEVICE, *, name: str | None = None, constrained: bool = False,
        aggregators: Collection[str] = (), fan_outs_only: bool = False,
    ):
        self.model_path = Path(model_path)
        self.device = resolve_device(device)
        self.name = name or f"hf:{self.model_path.name}"
        self.constrained, self.aggregators, self.fan_outs_only = constrained, tuple(aggregators), fan_outs_only
        self._model: Any = None
        self._tokenizer: Any = None
        self._vocabulary: Any = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        if self._model is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        model = AutoModelForCausalLM.from_pretrained(self.model_path).to(self.device)
        model.eval()
        self._tokenizer, self._model = tokenizer, model

    def _chooser(self, inner: Any, prompts: Sequence[list[dict]]) -> Any:
        """`inner`, or under `constrained` the same sampler held to workflows that parse against
        each row's catalogue (`conductor.constrained`)."""
        if not self.constrained:
            return inner
        from conductor_pipeline.conductor.constrained import ConstrainedChooser, TokenTexts, grammars_of_prompts

        if self._vocabulary is None:
            self._vocabulary = TokenTexts(self._tokenizer, self._stop_ids())
        grammars = grammars_of_prompts(prompts, self.aggregators, fan_outs_only=self.fan_outs_only)
        return ConstrainedChooser(inner, grammars, self._vocabulary)

    def _generate(
        self,
        messages: list[dict],
        n: int,
        temperature: float,
        max_new_tokens: int,
        seed: int | None,
    ) -> list[PolicyOutput]:
        import torch

        with self._lock:
            self._load()
            tokenizer, model = self._tokenizer, self._model
            prompt = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            greedy = temperature <= 0.0
            started = time.perf_counter()
            # A seeded call samples from a forked RNG, so it does not reseed anyone else's (an
            # unseeded one advances the global RNG, so two unseeded calls draw different samples).
            with _seeded_rng(seed, self.device), torch.inference_mode():
                # The n samples are n rows of the same prompt, which is run through the model once.
                completions = sample_rows(
                    model, [prompt] * (1 if greedy else n), max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id, stop_token_ids=self._stop_ids(), device=self.device,
                    choose=self._chooser(GreedyChooser() if greedy else WarpedSampler(temperature),
                                         [messages] * (1 if greedy else n)),
                )
            latency = time.perf_counter() - started
        if greedy:  # greedy decoding is deterministic: one pass serves all n
            completions = completions * n
        return self._outputs(completions, [len(prompt)] * len(completions), latency)

    def _stop_ids(self) -> list[int]:
        """The tokens that end a completion: the model's end-of-turn tokens and the padding token."""
        return sorted(set(_as_list(self._model.generation_config.eos_token_id)) | {self._tokenizer.pad_token_id})

    def _outputs(self, rows: list[list[int]], prompt_lengths: Sequence[int], latency: float) -> list[PolicyOutput]:
        """Completion token rows cut at their first stop token, decoded."""
        tokenizer = self._tokenizer
        stop_ids = set(self._stop_ids())
        outputs = []
        for row, prompt_length in zip(rows, prompt_lengths, strict=True):
            length = next((i + 1 for i, tok in enumerate(row) if tok in stop_ids), len(row))
            finish = "stop" if length < len(row) or row[-1] in stop_ids else "length"
            outputs.append(
                PolicyOutput(
                    text=tokenizer.decode(row[:length], skip_special_tokens=True),
                    prompt_tokens=prompt_length,
                    completion_tokens=length,
                    latency_s=latency,
                    finish_reason=finish,
                )
            )
        return outputs

    def _generate_batch(
        self,
        prompts: list[list[dict]],
        temperature: float,
        max_new_tokens: int,
        seeds: list[int],
        max_batch_tokens: int,
    ) -> list[PolicyOutput]:
        import torch

        with self._lock:
            self._load()
            tokenizer, model = self._tokenizer, self._model
            encoded = [
                tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
                    "input_ids"
                ]
                for messages in prompts
            ]
            lengths = [len(ids) for ids in encoded]
            outputs: list[PolicyOutput | None] = [None] * len(prompts)
            for chunk in _length_chunks(lengths, max_new_tokens, max_batch_tokens):
                choose = self._chooser(
                    SeededGumbelSampler([seeds[i] for i in chunk], temperature, self.device)
                    if temperature > 0.0 else GreedyChooser(),
                    [prompts[i] for i in chunk],
                )
                started = time.perf_counter()
                with torch.inference_mode():
                    completions = sample_rows(
                        model, [encoded[i] for i in chunk], max_new_tokens=max_new_tokens,
                        pad_token_id=tokenizer.pad_token_id, stop_token_ids=self._stop_ids(), device=self.device,
                        choose=choose,
                    )
                # Wall time shared out: what each question cost the machine, not how long it waited.
                latency = (time.perf_counter() - started) / len(chunk)
                decoded = self._outputs(completions, [lengths[i] for i in chunk], latency)
                for index, output in zip(chunk, decoded, strict=True):
                    outputs[index] = output
        return [output for output in outputs if output is not None]

    async def propose(
        self,
        messages: list[dict],
        *,
        n: int = 1,
        temperature: float,
        max_new_tokens: int,
        seed: int | None = None,
    ) -> list[PolicyOutput]:
        if n < 1:
            raise ValueError("n must be at least 1")
        return await asyncio.to_thread(
            self._generate, messages, n, temperature, max_new_tokens, seed
        )

    async def propose_batch(
        self,
        prompts: Sequence[list[dict]],
        *,
        temperature: float,
        max_new_tokens: int,
        seeds: Sequence[int],
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    ) -> list[PolicyOutput]:
        """One sample for each prompt, many prompts per forward pass: prompts of similar length are
        left-padded into batches of at most `max_batch_tokens` padded prompt-plus-completion tokens,
        and the start a batch's prompts share (the system prompt) is computed once for all of them.

        Each prompt samples through a generator of its own, seeded with its seed (Gumbel-max over
        the temperature-scaled logits: an exact sample of the same distribution as `propose`), so
        its text does not depend on which prompts share its batch. It is not the text `propose`
        draws with the same seed: that one comes from torch's global generator. Each output's
        `latency_s` is its batch's wall time divided by the batch's size.
        """
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if not prompts:
            return []
        return await asyncio.to_thread(
            self._generate_batch, list(prompts), temperature, max_new_tokens, list(seeds), max_batch_tokens
        )

    async def aclose(self) -> None:
        self._model = self._tokenizer = None


def _length_chunks(lengths: Sequence[int], max_new_tokens: int, max_batch_tokens: int) -> list[list[int]]:
    """Indices of `lengths` grouped by length (little padding), each group's padded size
    (rows x (longest prompt + max_new_tokens)) within `max_batch_tokens`; one row always fits."""
    chunks: list[list[int]] = []
    chunk: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        if chunk and (len(chunk) + 1) * (lengths[index] + max_new_tokens) > max_batch_tokens:
            chunks.append(chunk)
            chunk = []
        chunk.append(index)
    return chunks + [chunk] if chunk else chunks


@contextlib.contextmanager
def _seeded_rng(seed: int | None, device: str) -> Iterator[None]:
    """torch's global RNG (CPU, and `device` when it is a GPU) seeded with `seed` inside the block
    and restored after it; nothing at all when `seed` is None."""
    if seed is None:
        yield
        return
    import torch

    index = cuda_index(device)
    devices = [torch.cuda.current_device() if index is None else index] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
