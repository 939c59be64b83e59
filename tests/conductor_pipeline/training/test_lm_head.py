import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM
from trl.trainer.utils import add_fused_lm_head

from conductor_pipeline.training.lm_head import labelled_positions_only


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
