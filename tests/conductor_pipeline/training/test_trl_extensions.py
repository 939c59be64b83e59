"""The TRL extensions compute TRL's own losses and gradients: the CPU LM head that scores labelled
positions only, and the shared-prompt GRPO trainer, on real tiny models."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM
from trl.trainer.utils import add_fused_lm_head

from conductor_pipeline.training import trl_extensions
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.training.trl_extensions import (
    SharedPromptGRPOTrainer,
    check_trl_version,
    labelled_positions_only,
    shares_prompts,
)

GROUP, QUESTIONS, PROMPT, COMPLETION = 4, 3, 14, 9


def _length_reward(prompts, completions, **kwargs):
    return [float(len(c[0]["content"]) % 3) for c in completions]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny") / "model")


def _trainer(cls, model_path, output_dir, **overrides):
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "route " * (2 + i)}]} for i in range(6)])
    settings = GRPOSettings.cpu_profile(
        num_generations=GROUP, questions_per_step=QUESTIONS, per_device_train_batch_size=GROUP * QUESTIONS, max_steps=1,
        **overrides,
    )
    torch.manual_seed(0)
    return cls(
        model=str(model_path), reward_funcs=[_length_reward], args=settings.to_grpo_config(output_dir),
        train_dataset=dataset, processing_class=tokenizer,
    )


def _batch(pad_token_id: int) -> dict:
    """Three prompts (one left-padded) of four rollouts each, rows shuffled as TRL shuffles a
    generation batch, completions of different lengths right-padded; some run to the length cap
    unpadded, as clipped rollouts do."""
    import torch

    generator = torch.Generator().manual_seed(1)
    rows = GROUP * QUESTIONS
    prompts = torch.randint(10, 500, (QUESTIONS, PROMPT), generator=generator)
    prompt_mask = torch.ones(QUESTIONS, PROMPT, dtype=torch.long)
    prompts[1, :4], prompt_mask[1, :4] = pad_token_id, 0
    order = torch.randperm(rows, generator=generator)
    completion_mask = torch.ones(rows, COMPLETION, dtype=torch.long)
    for row in range(rows):
        if row % 5 != 0:  # every fifth row runs to the length cap, as a clipped rollout does
            completion_mask[row, 2 + row % (COMPLETION - 2):] = 0
    completions = torch.randint(10, 500, (rows, COMPLETION), generator=generator).masked_fill(completion_mask == 0, pad_token_id)
    return {
        "prompt_ids": prompts.repeat_interleave(GROUP, 0)[order],
        "prompt_mask": prompt_mask.repeat_interleave(GROUP, 0)[order],
        "completion_ids": completions,
        "completion_mask": completion_mask,
        "advantages": torch.randn(rows, generator=generator),
        "num_items_in_batch": completion_mask.sum(),
    }


def _loss_and_gradients(trainer, batch):
    trainer.model.train()
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = 1  # what the Trainer sets inside its training loop
    loss = trainer.compute_loss(trainer.model, dict(batch))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("rows", "rows_per_pass"), [(None, 32), (7, 32), (None, 5)],
    ids=["whole groups", "a micro-batch with unequal groups", "passes of unequal lengths"],
)
def test_the_shared_prompt_loss_and_gradients_are_trls_own(model_path, tmp_path, monkeypatch, rows, rows_per_pass):
    import torch
    from trl import GRPOTrainer

    monkeypatch.setattr(trl_extensions, "ROWS_PER_COMPLETION_PASS", rows_per_pass)
    theirs = _trainer(GRPOTrainer, model_path, tmp_path / "trl")
    ours = _trainer(SharedPromptGRPOTrainer, model_path, tmp_path / "shared")
    assert shares_prompts(ours) and ours.rollout_func is not None
    batch = _batch(ours.processing_class.pad_token_id)
    if rows is not None:  # the first rows of a shuffled generation batch: 1-4 rollouts of each prompt
        batch = {key: value if value.dim() == 0 else value[:rows] for key, value in batch.items()}
        batch["num_items_in_batch"] = batch["completion_mask"].sum()
        counts = torch.unique(batch["prompt_ids"], dim=0, return_counts=True)[1]
        assert len(set(counts.tolist())) > 1
    with labelled_positions_only():
        expected_loss, expected = _loss_and_gradients(theirs, batch)
        loss, gradients = _loss_and_gradients(ours, batch)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    assert set(gradients) == set(expected) and len(expected) > 10
    for name, gradient in expected.items():
        torch.testing.assert_close(gradients[name], gradient, rtol=1e-4, atol=1e-6, msg=name)
    assert any(float(g.abs().max()) > 1e-4 for g in expected.values())  # not a comparison of zeros


def test_setups_it_does_not_cover_run_trls_own_code(model_path, tmp_path):
    trainer = _trainer(SharedPromptGRPOTrainer, model_path, tmp_path / "penalty", share_prompt_prefix=True)
    trainer.args.repetition_penalty = 1.2
    assert not shares_prompts(trainer)


def test_this_trl_is_the_release_the_extensions_were_written_for_and_another_is_refused(monkeypatch):
    """Upgrading TRL fails here first: re-check both extensions against the new release's source."""
    import transformers
    import trl
    import trl.trainer.utils as trl_utils

    check_trl_version()
    assert callable(getattr(trl_utils, "_use_triton", None)), "TRL's per-call LM-head hook is gone"
    assert list(inspect.signature(trl_utils._use_triton).parameters) == ["device"], "labelled_positions_only's hook"
    assert "rollout_func" in inspect.signature(trl.GRPOTrainer.__init__).parameters
    assert list(inspect.signature(trl.GRPOTrainer._get_per_token_logps_and_entropies).parameters)[:7] == [
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
    ]
    assert list(inspect.signature(transformers.Trainer._save_checkpoint).parameters) == ["self", "model", "trial"], (
        "save_checkpoint_now's call")
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(RuntimeError, match="written against|extends TRL 1.16"):
        check_trl_version()


def test_a_shared_prompt_run_trains_and_checkpoints(model_path, tmp_path):
    """Two GRPO steps through the project's `train_grpo` with sampling and the loss shared."""
    from conductor_pipeline.training.grpo import train_grpo

    settings = GRPOSettings.cpu_profile(
        num_generations=GROUP, questions_per_step=2, per_device_train_batch_size=GROUP * 2, max_steps=2, save_steps=2,
        max_completion_length=12,
    )
    assert settings.share_prompt_prefix
    rows = [{"prompt": [{"role": "user", "content": f"route question {i}"}]} for i in range(4)]
    outcome = train_grpo(model_path, rows, _length_reward, settings, tmp_path / "run")
    assert outcome.global_step == 2 and outcome.checkpoint_dir is not None
    assert all(row["completion_length_mean"] <= 12 for row in outcome.steps)


def _loss_grads_and_flops(model, input_ids, labels):
    model.zero_grad()
    with FlopCounterMode(display=False) as counter:
        loss = model(input_ids=input_ids, labels=labels, fused_lm_head=True).loss
        loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return loss.detach(), grads, counter.get_total_flops()


def test_cpu_training_scores_only_labelled_positions_with_the_same_loss_and_gradients():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    add_fused_lm_head(model)
    input_ids = torch.randint(0, 512, (2, 64))
    labels = input_ids.clone()
    labels[:, :56] = -100  # a long prompt without labels, a short completion with them

    loss, grads, flops = _loss_grads_and_flops(model, input_ids, labels)
    with labelled_positions_only():
        compact_loss, compact_grads, compact_flops = _loss_grads_and_flops(model, input_ids, labels)

    torch.testing.assert_close(compact_loss, loss)
    for name, grad in grads.items():
        torch.testing.assert_close(compact_grads[name], grad, msg=name)
    assert compact_flops < 0.8 * flops  # the unlabelled prompt no longer goes through the head
    # Outside the block TRL's own choice is back: every position is projected again.
    assert _loss_grads_and_flops(model, input_ids, labels)[2] == flops


def test_constrained_rollouts_are_workflows_over_each_prompts_own_catalogue(model_path, tmp_path):
    """With `constrained_decoding`, TRL's rollout hook samples only prefixes of workflows that parse
    against the workers each prompt shows (the untrained model alone writes none)."""
    from transformers import AutoTokenizer

    from conductor_pipeline.conductor.constrained import grammar_of_prompt
    from conductor_pipeline.conductor.prompt import build_conductor_prompt
    from conductor_pipeline.training.grpo import build_grpo_trainer
    from conductor_pipeline.training.trl_extensions import shared_prompt_rollout

    catalogues = [["gpt-4o", "llama-3.1-8b"], ["claude-3.5-sonnet", "majority-vote", "gemini-1.5-pro"]]
    prompts = [build_conductor_prompt(f"What is {i} + 1?", seats, naming="names") for i, seats in enumerate(catalogues)]
    settings = GRPOSettings.cpu_profile(
        num_generations=GROUP, questions_per_step=2, max_steps=1, max_completion_length=40, constrained_decoding=True,
    )
    trainer = build_grpo_trainer(model_path, [{"prompt": p} for p in prompts], _length_reward, settings, tmp_path / "run")
    torch.manual_seed(0)
    rolled = shared_prompt_rollout([p for p in prompts for _ in range(GROUP)], trainer)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    for index, completion in enumerate(rolled["completion_ids"]):
        grammar = grammar_of_prompt(prompts[index // GROUP])
        text = tokenizer.decode(completion, skip_special_tokens=True)
        assert text.startswith("model_id = ") and grammar.advance(grammar.start(), text) is not None, text
        named = [name for seats in catalogues for name in seats if f'"{name}"' in text]
        assert set(named) <= set(catalogues[index // GROUP]), text

    # Settings that no sampler can hold are refused when they are made, before any trainer is built.
    with pytest.raises(ValueError, match="share_prompt_prefix .* or use_vllm"):
        replace(settings, share_prompt_prefix=False)
