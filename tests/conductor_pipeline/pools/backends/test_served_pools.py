"""The shipped pools served over HTTP (tiny-serve, local-qwen-vllm, hosted-six) load and make sense."""

from __future__ import annotations

import pytest

from conductor_pipeline.pools.backends.openai_compat import OpenAICompatWorker
from conductor_pipeline.pools.backends.vllm_server import VllmPool
from conductor_pipeline.pools.config import MissingApiKeyError, check_api_keys, load_pool


def test_tiny_serve_is_local_openai_seats_without_keys() -> None:
    pool = load_pool("tiny-serve")
    assert {seat.backend for seat in pool.workers} == {"openai"}
    assert all(seat.endpoint.startswith("http://127.0.0.1:") for seat in pool.workers)
    assert all(seat.api_key_env is None for seat in pool.workers)
    check_api_keys(pool, environ={})


def test_local_qwen_vllm_fits_one_gpu() -> None:
    pool = load_pool("local-qwen-vllm")
    assert len(pool.workers) == 3 and {seat.backend for seat in pool.workers} == {"vllm"}
    assert [seat.params_b for seat in pool.workers] == sorted(seat.params_b for seat in pool.workers)
    servers = VllmPool.from_pool(pool)  # checks memory fractions < 1 and distinct ports
    assert sum(s.seat.vllm.gpu_memory_utilization for s in servers.servers) < 0.9
    assert all(s.argv[:3] == ["vllm", "serve", s.seat.model] for s in servers.servers)
    assert [seat.backend for seat in servers.served_pool(pool).workers] == ["openai"] * 3


def test_hosted_six_spans_four_families_and_needs_its_keys() -> None:
    pool = load_pool("hosted-six")
    assert len(pool.workers) == 6
    assert len({seat.family for seat in pool.workers}) == 4
    assert all(seat.price_input_per_mtok > 0 and seat.price_output_per_mtok > 0 for seat in pool.workers)
    assert all(seat.endpoint.startswith("https://") for seat in pool.workers)
    key_vars = {seat.api_key_env for seat in pool.workers}
    assert key_vars == {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "TOGETHER_API_KEY", "DEEPSEEK_API_KEY"}
    with pytest.raises(MissingApiKeyError, match="deepseek-r1.*DEEPSEEK_API_KEY"):
        check_api_keys(pool, environ={v: "set" for v in key_vars - {"DEEPSEEK_API_KEY"}})
    with pytest.raises(MissingApiKeyError, match="llama-3.3-70b"):
        OpenAICompatWorker(pool.seat("llama-3.3-70b"), pool.retry, environ={})
    check_api_keys(pool, environ=dict.fromkeys(key_vars, "set"))
    reasoning = pool.seat("deepseek-r1")
    assert reasoning.max_tokens >= 16384  # the floor that keeps a reasoning model from being cut off
