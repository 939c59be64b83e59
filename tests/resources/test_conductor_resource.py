"""The conductor-policy resource builds the policy its configuration names."""

from __future__ import annotations

import asyncio

import pytest

from conductor_pipeline.paths import ARTIFACTS_ENV
from conductor_pipeline.conductor.endpoint_policy import OpenAIEndpointPolicy
from conductor_pipeline.conductor.hf_policy import HFLocalPolicy
from conductor_pipeline.conductor.prompt import PromptSpec
from conductor_pipeline.conductor.protocols import PolicyError
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
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


def test_tiny_default_is_built_offline_under_the_artifacts_root_and_capped(monkeypatch, tmp_path):
    monkeypatch.setenv(ARTIFACTS_ENV, str(tmp_path / "shared-volume"))
    resource = ConductorPolicyResource(max_new_tokens=1024, n_examples=2)
    policy = resource.build_policy()
    assert isinstance(policy, HFLocalPolicy)
    assert (tmp_path / "shared-volume" / "models" / "tiny-conductor" / "config.json").is_file()
    assert resource.effective_max_new_tokens == TINY_MAX_NEW_TOKENS
    assert resource.arm_label == "hf:tiny-conductor" and len(resource.examples()) == 2
    checkpoint = ConductorPolicyResource(model_path=str(tmp_path / "tiny"), max_new_tokens=1024)
    assert checkpoint.effective_max_new_tokens == 1024 and checkpoint.arm_label == "hf:tiny"


def test_a_checkpoint_takes_its_training_prompt_and_the_fingerprint_follows_weights_and_prompt(tmp_path):
    model = build_tiny_causal_lm(tmp_path / "model")
    resource = ConductorPolicyResource(n_examples=4, max_new_tokens=1024, naming="ordinal", device="cpu")
    like_resource = resource.with_checkpoint(str(model))
    assert (like_resource.n_examples, like_resource.max_new_tokens, like_resource.naming) == (4, 1024, "ordinal")
    trained = resource.with_checkpoint(str(model), PromptSpec(naming="names", n_examples=0, max_new_tokens=80,
                                                              temperature=0.7))
    assert (trained.n_examples, trained.max_new_tokens, trained.naming, trained.temperature) == (0, 80, "names", 0.7)
    assert trained.device == "cpu" and trained.arm_label == "hf:model"

    fingerprint = trained.fingerprint()
    assert trained.model_copy().fingerprint() == fingerprint
    assert like_resource.fingerprint() != fingerprint  # another prompt
    build_tiny_causal_lm(tmp_path / "model", seed=1)  # retrained in place
    assert trained.fingerprint() != fingerprint
    with pytest.raises(FileNotFoundError, match="no model weights"):
        ConductorPolicyResource(model_path=str(tmp_path)).fingerprint()
    endpoint = ConductorPolicyResource(kind="openai_endpoint", base_url="http://127.0.0.1:9/v1", model="a")
    assert endpoint.fingerprint() != endpoint.model_copy(update={"model": "b"}).fingerprint()
