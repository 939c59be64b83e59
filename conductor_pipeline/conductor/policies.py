"""Conductor policies: whatever turns a conductor prompt into workflow text.

Two kinds share one async interface so the orchestrator and the eval arms never care which runs:
a local Hugging Face causal LM (the tiny CPU model, or a training checkpoint on a GPU), and any
OpenAI-compatible chat endpoint (a prompted conductor on vLLM, `transformers serve`, a hosted
provider). Model output is untrusted text: policies return it verbatim, the parser judges it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx

from conductor_pipeline.conductor.generation import GreedyChooser, SeededGumbelSampler, WarpedSampler, sample_rows
from conductor_pipeline.corpora.sources import sha256_of
from conductor_pipeline.pools.backends.openai_compat import TRANSIENT_HTTP_STATUSES
from conductor_pipeline.records import stable_id

# Transient endpoint faults (rate limits, overload, restarts) are retried this many times with
# exponential backoff before the policy gives up; the caller then records an infrastructure failure.
DEFAULT_MAX_RETRIES = 3
DEFAULT_BACKOFF_S = 1.0
# Long enough for a 7B model to write a 1k-token workflow on a busy shared server.
DEFAULT_TIMEOUT_S = 120.0
# Padded (prompt + completion) tokens one batched `generate` may hold: the key-value cache grows
# with it. 32k tokens is ~0.4 GiB of cache for a 0.5B model and ~2 GiB for a 7B one in bf16.
DEFAULT_MAX_BATCH_TOKENS = 32_768

# --- where a local model runs --------------------------------------------------------------------

AUTO_DEVICE = "auto"
# What a device setting may say: `auto` (a GPU when torch sees one, else the CPU), `cpu`, `cuda`
# (the current GPU) or `cuda:N`.
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
DEVICE_HELP = (
    "Where local models run: 'auto' (cuda when torch sees a GPU, else cpu), 'cpu', 'cuda' or 'cuda:N'"
)


def resolve_device(device: str = AUTO_DEVICE) -> str:
    """The torch device a setting names: `auto` becomes `cuda` when torch sees a GPU and `cpu`
    otherwise; `cpu`, `cuda` and `cuda:N` are kept as written (a configuration may be built on a
    machine other than the one that runs it)."""
    if not DEVICE_PATTERN.fullmatch(device):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device != AUTO_DEVICE:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def select_cuda_device(device: str) -> None:
    """Make `cuda:N` the current GPU, so code that places tensors on plain `cuda` (a trainer under
    accelerate, one process) uses it; nothing for `cpu` or `cuda`."""
    if device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(int(device.split(":", 1)[1]))


@dataclass(frozen=True, slots=True)
class PolicyOutput:
    """One sampled completion and what it cost.

    `latency_s` is the wall time of the request or batch that produced it (n samples produced
    together share it); None when the sampler did not time it (a trainer's batched rollouts).
    `tokens_estimated` is set when an endpoint returned one usage block for several samples and
    the per-sample split is proportional to text length.
    """

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float | None
    finish_reason: str | None = None
    tokens_estimated: bool = False


@runtime_checkable
class ConductorPolicy(Protocol):
    """Anything that samples `n` workflow texts for one conductor prompt (chat messages)."""

    name: str

    async def propose(
        self,
        messages: list[dict],
        *,
        n: int = 1,
        temperature: float,
        max_new_tokens: int,
        seed: int | None = None,
    ) -> list[PolicyOutput]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class BatchingPolicy(ConductorPolicy, Protocol):
    """A policy that answers many prompts at once (one sample each, each with its own seed):
    evaluation hands it a whole group of questions instead of one prompt at a time."""

    async def propose_batch(
        self,
        prompts: Sequence[list[dict]],
        *,
        temperature: float,
        max_new_tokens: int,
        seeds: Sequence[int],
    ) -> list[PolicyOutput]: ...


class PolicyError(RuntimeError):
    """The policy could not produce outputs (endpoint down after retries, bad response shape).

    Callers treat it as an infrastructure failure, never as an unparseable workflow.
    """


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
    (`resolve_device`: `auto` is a GPU when there is one).
    """

    def __init__(self, model_path: str | Path, device: str = AUTO_DEVICE, *, name: str | None = None):
        self.model_path = Path(model_path)
        self.device = resolve_device(device)
        self.name = name or f"hf:{self.model_path.name}"
        self._model: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        if self._model is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        model = AutoModelForCausalLM.from_pretrained(self.model_path).to(self.device)
        model.eval()
        self._tokenizer, self._model = tokenizer, model

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
                    choose=GreedyChooser() if greedy else WarpedSampler(temperature),
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
                choose = (
                    SeededGumbelSampler([seeds[i] for i in chunk], temperature, self.device)
                    if temperature > 0.0 else GreedyChooser()
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

    index = torch.device(device).index if device.startswith("cuda") else None
    devices = [torch.cuda.current_device() if index is None else index] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class OpenAIEndpointPolicy:
    """A prompted conductor behind any OpenAI-compatible `/chat/completions` endpoint.

    Asks for all n samples in one request; servers that ignore `n` (some do) are topped up with
    single-sample requests, so callers always get exactly n outputs. The API key is read from the
    environment variable named by `api_key_env` at construction and never logged.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        *,
        name: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        extra_body: dict[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name or f"openai:{model}"
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.extra_body = dict(extra_body or {})
        headers = {}
        if api_key_env is not None:
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise PolicyError(f"environment variable {api_key_env} is not set")
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport
        )

    async def _post(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        last_error = "no attempt made"
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            started = time.perf_counter()
            try:
                response = await self._client.post("/chat/completions", json=body)
            except (httpx.TimeoutException, httpx.TransportError) as error:
                last_error = type(error).__name__
                continue
            latency = time.perf_counter() - started
            if response.status_code in TRANSIENT_HTTP_STATUSES:
                last_error = f"HTTP {response.status_code}"
                continue
            if response.status_code >= 400:
                raise PolicyError(f"HTTP {response.status_code}: {response.text[:300]}")
            try:
                return response.json(), latency
            except ValueError as error:
                raise PolicyError("endpoint returned a non-JSON body") from error
        raise PolicyError(f"endpoint failed after {self.max_retries + 1} attempts: {last_error}")

    async def _request(
        self,
        messages: list[dict],
        n: int,
        temperature: float,
        max_new_tokens: int,
        seed: int | None,
    ) -> list[PolicyOutput]:
        body: dict[str, Any] = {
            **self.extra_body,
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_new_tokens,
        }
        if n > 1:
            body["n"] = n
        if seed is not None:
            body["seed"] = seed
        payload, latency = await self._post(body)
        try:
            choices = payload["choices"]
            texts = [(c["message"].get("content") or "", c.get("finish_reason")) for c in choices]
        except (KeyError, TypeError, AttributeError) as error:
            raise PolicyError("response has no choices[].message") from error
        usage = payload.get("usage") or {}
        prompt_tokens = usage.get("prompt_tokens")
        total_completion = usage.get("completion_tokens")
        total_chars = sum(len(text) for text, _ in texts) or 1
        outputs = []
        for text, finish in texts:
            if total_completion is None:
                completion = None
            elif len(texts) == 1:
                completion = int(total_completion)
            else:
                completion = round(total_completion * len(text) / total_chars)
            outputs.append(
                PolicyOutput(
                    text=text,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion,
                    latency_s=latency,
                    finish_reason=finish,
                    tokens_estimated=len(texts) > 1,
                )
            )
        return outputs

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
        outputs = await self._request(messages, n, temperature, max_new_tokens, seed)
        missing = n - len(outputs)
        if missing > 0:
            # Distinct seeds, so a seeded top-up does not return the same sample again.
            top_ups = await asyncio.gather(
                *(
                    self._request(
                        messages, 1, temperature, max_new_tokens, None if seed is None else seed + i
                    )
                    for i in range(1, missing + 1)
                )
            )
            outputs.extend(output for batch in top_ups for output in batch)
        return outputs[:n]

    async def aclose(self) -> None:
        await self._client.aclose()
