"""What a conductor policy is: whatever turns a conductor prompt into workflow text.

Two kinds share one async interface so the orchestrator and the eval arms never care which runs:
a local Hugging Face causal LM (`conductor.hf_policy`) and any OpenAI-compatible chat endpoint
(`conductor.endpoint_policy`). Model output is untrusted text: policies return it verbatim, the
parser judges it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


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
