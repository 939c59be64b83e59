"""The conductor-policy resource builds the policy its configuration names."""

from __future__ import annotations

import asyncio

import pytest

import resources.conductor as conductor_module
from conductor_pipeline.conductor.policies import HFLocalPolicy, OpenAIEndpointPolicy, PolicyError
from resources.conductor import TINY_MAX_NEW_TOKENS, ConductorPolicyResource


def test_endpoint_policy_needs_url_and_model_and_reads_the_key_from_the_named_variable(monkeypatch):
    with pytest.raises(ValueError, match="base_url"):
        ConductorPolicyResource(kind="openai_endpoint").build_policy()
    resource = ConductorPolicyResource(
        kind="openai_endpoint", base_url="http://127.0.0.1:9/v1", model="qwen", api_key_env="CONDUCTOR_TEST_KEY"
    )
    monkeypatch.delenv("CONDUCTOR_TEST_KEY", raising=False)
    with pytest.raises(PolicyError, match="CONDUCTOR_TEST_KEY"):
        resource.build_policy()
    monkeypatch.setenv("CONDUCTOR_TEST_KEY", "secret-value")
    policy = resource.build_policy()
    assert isinstance(policy, OpenAIEndpointPolicy) and resource.arm_label == "openai:qwen"
    assert "secret-value" not in repr(resource)
    asyncio.run(policy.aclose())


def test_tiny_default_is_built_offline_and_capped(monkeypatch, tmp_path):
    monkeypatch.setattr(conductor_module, "TINY_POLICY_DIR", tmp_path / "tiny")
    resource = ConductorPolicyResource(max_new_tokens=1024, n_examples=2)
    policy = resource.build_policy()
    assert isinstance(policy, HFLocalPolicy) and (tmp_path / "tiny" / "config.json").is_file()
    assert resource.effective_max_new_tokens == TINY_MAX_NEW_TOKENS
    assert resource.arm_label == "hf:tiny-conductor" and len(resource.examples()) == 2
    checkpoint = ConductorPolicyResource(model_path=str(tmp_path / "tiny"), max_new_tokens=1024)
    assert checkpoint.effective_max_new_tokens == 1024 and checkpoint.arm_label == "hf:tiny"
