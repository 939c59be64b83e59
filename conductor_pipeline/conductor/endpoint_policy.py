"""The endpoint conductor policy: a prompted conductor behind any OpenAI-compatible chat endpoint
(vLLM, `transformers serve`, a hosted provider), with transient faults retried.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import httpx

from conductor_pipeline.conductor.protocols import PolicyError, PolicyOutput
from conductor_pipeline.pools.backends.openai_compat import TRANSIENT_HTTP_STATUSES

# Transient endpoint faults (rate limits, overload, restarts) are retried this many times with
# exponential backoff before the policy gives up; the caller then records an infrastructure failure.
DEFAULT_MAX_RETRIES = 3
DEFAULT_BACKOFF_S = 1.0
# Long enough for a 7B model to write a 1k-token workflow on a busy shared server.
DEFAULT_TIMEOUT_S = 120.0


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
