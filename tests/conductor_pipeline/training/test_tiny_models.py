"""The tiny offline policy model: builds, reuses, loads through Auto classes, chats, generates."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conductor_pipeline.training.tiny_models import (
    IM_END,
    IM_START,
    MANIFEST_NAME,
    QWEN2_PRETOKENIZE_REGEX,
    build_tiny_causal_lm,
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny") / "model")


def test_loads_offline_and_generates_from_chat_template(tiny_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen2"
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token is not None
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith(f"{IM_START}assistant\n")
    assert f"{IM_START}user\nWhat is 2 + 2?{IM_END}" in text
    # Chat markers are single tokens, as in Qwen2.5.
    assert len(tokenizer(IM_START).input_ids) == 1
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    torch.manual_seed(0)
    output = model.generate(**encoded, max_new_tokens=8, do_sample=True)
    assert output.shape[1] > encoded["input_ids"].shape[1]


def test_loaded_tokenizer_encodes_like_the_trained_one(tiny_dir):
    """AutoTokenizer rebuilds Qwen2's pre-tokenizer; the trained tokenizer.json must agree."""
    from tokenizers import Tokenizer

    loaded = AutoTokenizer.from_pretrained(tiny_dir)
    trained = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    text = 'model_id = [0, 1]\nsubtasks = ["Solve $\\frac{1}{2}+x=3$", "Check"]\n  café 🙂'
    assert loaded(text).input_ids == trained.encode(text).ids
    assert loaded.decode(loaded(text).input_ids) == text


def test_build_is_idempotent_and_rebuilds_on_new_settings(tiny_dir, tmp_path):
    weights = tiny_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert build_tiny_causal_lm(tiny_dir) == tiny_dir
    assert weights.stat().st_mtime_ns == mtime

    other = tmp_path / "other"
    build_tiny_causal_lm(other, texts=["alpha beta gamma"] * 50, vocab_size=300, hidden_size=32)
    first_hash = json.loads((other / MANIFEST_NAME).read_text())["config_hash"]
    build_tiny_causal_lm(other, texts=["alpha beta gamma"] * 50, vocab_size=300, hidden_size=16)
    manifest = json.loads((other / MANIFEST_NAME).read_text())
    assert manifest["config_hash"] != first_hash
    assert AutoModelForCausalLM.from_pretrained(other).config.hidden_size == 16


def test_refuses_to_overwrite_a_foreign_folder(tmp_path):
    (tmp_path / "precious.txt").write_text("not a model")
    with pytest.raises(FileExistsError):
        build_tiny_causal_lm(tmp_path)


def test_tokenizer_knows_the_conductors_prompt_and_workflow_words(tiny_dir):
    """The prompt is most of every rollout's tokens; its words and the workflow's get merges."""
    from conductor_pipeline.conductor.prompt import build_conductor_prompt, catalogue_from_pool
    from conductor_pipeline.pools.config import load_pool
    from conductor_pipeline.training.synthetic import COMPACT_SUBTASKS

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    for word in ("model", "subtasks", "access", "Solve", " problem", " final", " answer", " workflow", " worker"):
        assert len(tokenizer(word).input_ids) == 1, word
    for phrase in COMPACT_SUBTASKS:
        assert len(tokenizer(phrase).input_ids) <= 16, phrase
    prompt = build_conductor_prompt("What is 2 + 2?", catalogue_from_pool(load_pool("replay-mixed6")))
    characters = sum(len(m["content"]) for m in prompt)
    tokens = len(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    # 3.1 characters per token with the conductor prompts in the corpus; 2.1 without them (recipe 2).
    assert characters / tokens > 2.8


def test_every_shipped_seat_name_is_one_token_that_decodes_to_itself(tmp_path):
    from transformers import AutoTokenizer

    from conductor_pipeline.paths import POOLS_DIR
    from conductor_pipeline.pools.config import load_pool
    from conductor_pipeline.training.tiny_models import build_tiny_causal_lm, shipped_seat_names

    names = shipped_seat_names()
    assert {"gpt-4o", "llama-3.1-8b", "llama-3.1-405b"} <= set(names)
    # The tokenizer learns from a fixed list of pool files (TOKENIZER_POOLS), so that a new pool file
    # changes no recorded figure; every seat of every shipped pool file must still be a token.
    shipped = {seat.name for path in POOLS_DIR.glob("*.yaml") for seat in load_pool(path).workers}
    assert shipped <= set(names), sorted(shipped - set(names))
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_causal_lm(tmp_path / "tiny"))
    for name in names:
        ids = tokenizer(f'model_id = ["{name}"]', add_special_tokens=False)["input_ids"]
        assert tokenizer.convert_ids_to_tokens(ids).count(name) == 1, name
        assert tokenizer.decode(ids) == f'model_id = ["{name}"]'


def test_the_tiny_tokenizer_splits_text_as_transformers_rebuilds_qwen2_tokenizers() -> None:
    """Upgrading transformers fails here first if Qwen2Tokenizer's split changes: a tiny checkpoint
    would then encode differently when loaded than when its tokenizer was trained."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    assert QWEN2_PRETOKENIZE_REGEX == PRETOKENIZE_REGEX
