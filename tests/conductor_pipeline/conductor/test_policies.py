"""Conductor policies: the local HF model and an OpenAI-compatible endpoint over real HTTP."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conductor_pipeline.conductor.endpoint_policy import OpenAIEndpointPolicy
from conductor_pipeline.conductor.hf_policy import HFLocalPolicy
from conductor_pipeline.conductor.protocols import ConductorPolicy, PolicyError
from conductor_pipeline.devices import resolve_device
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm

MESSAGES = [{"role": "user", "content": "Route this question: what is 2 + 2?"}]


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    return HFLocalPolicy(build_tiny_causal_lm(tmp_path_factory.mktemp("tiny") / "model"))


def test_hf_policy_returns_n_samples_with_token_counts(tiny_policy):
    assert isinstance(tiny_policy, ConductorPolicy)
    outputs = asyncio.run(
        tiny_policy.propose(MESSAGES, n=4, temperature=1.0, max_new_tokens=12, seed=1)
    )
    assert len(outputs) == 4
    for output in outputs:
        assert isinstance(output.text, str)
        assert 1 <= output.completion_tokens <= 12
        assert output.prompt_tokens > 10
        assert output.finish_reason in {"stop", "length"}
    # Random-weight model at temperature 1: four samples are not all identical.
    assert len({output.text for output in outputs}) > 1


def test_auto_device_is_a_gpu_when_torch_sees_one_and_explicit_devices_are_kept(monkeypatch, tiny_policy):
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device() == resolve_device("auto") == expected
    assert [resolve_device(d) for d in ("cpu", "cuda", "cuda:1")] == ["cpu", "cuda", "cuda:1"]
    for bad in ("gpu", "cuda:", "CUDA", "cuda:x", ""):
        with pytest.raises(ValueError, match="device must be"):
            resolve_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    # The local policy resolves its device once, at construction (the default is auto).
    assert HFLocalPolicy(tiny_policy.model_path).device == "cpu"
    assert tiny_policy.device == expected


def test_hf_policy_seed_reproduces_and_greedy_repeats(tiny_policy):
    def sample(seed, temperature=1.0):
        return [
            o.text
            for o in asyncio.run(
                tiny_policy.propose(
                    MESSAGES, n=3, temperature=temperature, max_new_tokens=10, seed=seed
                )
            )
        ]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)
    greedy = sample(None, temperature=0.0)
    assert len(greedy) == 3 and len(set(greedy)) == 1
    import torch

    # Unseeded calls draw from the global RNG and advance it: two of them are two draws, and a
    # seeded call in between neither repeats nor resets them.
    torch.manual_seed(0)
    first = sample(None)
    seeded = sample(7)
    second = sample(None)
    assert first != second and seeded == sample(7)


class _FakeChatServer(ThreadingHTTPServer):
    """An OpenAI-compatible stub: ignores `n` (like some servers), fails the first call with 503."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: list[dict] = []
        self.headers_seen: list[str | None] = []
        self.fail_next = 1


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):
        server: _FakeChatServer = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.bodies.append(body)
        server.headers_seen.append(self.headers.get("Authorization"))
        if server.fail_next:
            server.fail_next -= 1
            self.send_response(503)
            self.end_headers()
            return
        if self.path != "/v1/chat/completions":
            self.send_response(404)
            self.end_headers()
            return
        text = f"model_id = [0]  # seed={body.get('seed')}"
        payload = {
            "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 21, "completion_tokens": 9},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def chat_server():
    server = _FakeChatServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_endpoint_policy_retries_tops_up_and_sends_key(chat_server, monkeypatch):
    monkeypatch.setenv("TEST_CONDUCTOR_KEY", "sk-test-123")
    base_url = f"http://127.0.0.1:{chat_server.server_address[1]}/v1"
    policy = OpenAIEndpointPolicy(
        base_url, "served-model", api_key_env="TEST_CONDUCTOR_KEY", backoff_s=0.01
    )

    async def run():
        try:
            return await policy.propose(MESSAGES, n=3, temperature=0.7, max_new_tokens=64, seed=5)
        finally:
            await policy.aclose()

    outputs = asyncio.run(run())
    assert len(outputs) == 3
    assert outputs[0].prompt_tokens == 21 and outputs[0].completion_tokens == 9
    assert {o.text for o in outputs} == {f"model_id = [0]  # seed={s}" for s in (5, 6, 7)}
    first = chat_server.bodies[0]
    assert first["n"] == 3 and first["max_tokens"] == 64 and first["model"] == "served-model"
    assert len(chat_server.bodies) == 4  # 503, the n=3 call answered with one choice, two top-ups
    assert set(chat_server.headers_seen) == {"Bearer sk-test-123"}
    assert "sk-test-123" not in repr(policy.__dict__)


def test_endpoint_policy_raises_after_retries_and_on_client_errors(chat_server):
    chat_server.fail_next = 10
    base_url = f"http://127.0.0.1:{chat_server.server_address[1]}/v1"
    policy = OpenAIEndpointPolicy(base_url, "m", max_retries=2, backoff_s=0.01)
    with pytest.raises(PolicyError, match="3 attempts"):
        asyncio.run(policy.propose(MESSAGES, temperature=0.0, max_new_tokens=8))
    chat_server.fail_next = 0
    wrong_path = OpenAIEndpointPolicy(f"http://127.0.0.1:{chat_server.server_address[1]}", "m")
    with pytest.raises(PolicyError, match="HTTP 404"):
        asyncio.run(wrong_path.propose(MESSAGES, temperature=0.0, max_new_tokens=8))


def test_endpoint_policy_requires_its_key_variable(monkeypatch):
    monkeypatch.delenv("MISSING_CONDUCTOR_KEY", raising=False)
    with pytest.raises(PolicyError, match="MISSING_CONDUCTOR_KEY"):
        OpenAIEndpointPolicy("http://127.0.0.1:1/v1", "m", api_key_env="MISSING_CONDUCTOR_KEY")


# Prompts of different lengths, so a batch pads some of them on the left.
BATCH_PROMPTS = [
    [{"role": "user", "content": text}]
    for text in (
        "Route this question: what is 2 + 2?",
        "Route: 7 x 6?",
        "Route this longer question, which pads the others: how many primes are there below one hundred?",
        "Route this one too: what is the derivative of x squared?",
    )
]


def test_batched_greedy_generation_equals_one_prompt_at_a_time(tiny_policy):
    alone = [
        asyncio.run(tiny_policy.propose(p, n=1, temperature=0.0, max_new_tokens=12, seed=None))[0] for p in BATCH_PROMPTS
    ]
    batched = asyncio.run(
        tiny_policy.propose_batch(BATCH_PROMPTS, temperature=0.0, max_new_tokens=12, seeds=[0, 1, 2, 3])
    )
    assert [o.text for o in batched] == [o.text for o in alone]
    assert [o.prompt_tokens for o in batched] == [o.prompt_tokens for o in alone]
    assert [o.completion_tokens for o in batched] == [o.completion_tokens for o in alone]


def test_batched_sampling_is_reproducible_and_independent_of_the_batch(tiny_policy):
    def sample(prompts, seeds, max_batch_tokens=32_768):
        outputs = asyncio.run(
            tiny_policy.propose_batch(
                prompts, temperature=1.0, max_new_tokens=12, seeds=seeds, max_batch_tokens=max_batch_tokens
            )
        )
        return [o.text for o in outputs]

    seeds = [11, 12, 13, 14]
    first = sample(BATCH_PROMPTS, seeds)
    assert sample(BATCH_PROMPTS, seeds) == first
    # One prompt per forward pass (a tiny token budget) draws the same texts as one batch.
    assert sample(BATCH_PROMPTS, seeds, max_batch_tokens=1) == first
    # A prompt's text depends on its own seed, not on which prompts share its batch.
    assert sample(BATCH_PROMPTS[2:3], seeds[2:3]) == first[2:3]
    assert sample(BATCH_PROMPTS, [21, 22, 23, 24]) != first
    with pytest.raises(ValueError, match="4 prompts but 3 seeds"):
        sample(BATCH_PROMPTS, seeds[:3])
