"""The shared-prompt GRPO trainer computes TRL's own loss and gradients, on a real tiny model."""

from __future__ import annotations

import pytest

from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.training.shared_prompt import SharedPromptGRPOTrainer, check_trl_version, shares_prompts
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm

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
    generation batch, completions of different lengths right-padded."""
    import torch

    generator = torch.Generator().manual_seed(1)
    rows = GROUP * QUESTIONS
    prompts = torch.randint(10, 500, (QUESTIONS, PROMPT), generator=generator)
    prompt_mask = torch.ones(QUESTIONS, PROMPT, dtype=torch.long)
    prompts[1, :4], prompt_mask[1, :4] = pad_token_id, 0
    order = torch.randperm(rows, generator=generator)
    completion_mask = torch.ones(rows, COMPLETION, dtype=torch.long)
    for row in range(rows):
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


def test_the_shared_prompt_loss_and_gradients_are_trls_own(model_path, tmp_path):
    import torch
    from trl import GRPOTrainer

    from conductor_pipeline.training.lm_head import labelled_positions_only

    theirs = _trainer(GRPOTrainer, model_path, tmp_path / "trl")
    ours = _trainer(SharedPromptGRPOTrainer, model_path, tmp_path / "shared")
    assert shares_prompts(ours) and ours.rollout_func is not None
    batch = _batch(ours.processing_class.pad_token_id)
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


def test_another_trl_release_is_refused_loudly(monkeypatch):
    import trl

    check_trl_version()
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
