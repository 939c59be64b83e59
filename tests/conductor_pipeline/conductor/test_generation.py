"""Sampling after shared prompts: every row is computed as if it were alone, on a real tiny model."""

from __future__ import annotations

import pytest

from conductor_pipeline.conductor.generation import (
    GreedyChooser,
    PrefixLayout,
    SeededGumbelSampler,
    WarpedSampler,
    sample_rows,
    shared_prefix_length,
)
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm

SYSTEM = {"role": "system", "content": "You route questions to models. " * 20}
QUESTIONS = (
    "Route this question: what is 2 + 2?",
    "Route: 7 x 6?",
    "Route this longer question, which pads the others: how many primes are there below one hundred?",
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_causal_lm(tmp_path_factory.mktemp("tiny") / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    rows = [
        tokenizer.apply_chat_template(
            [SYSTEM, {"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        for q in QUESTIONS
    ]
    return model, tokenizer, rows


def _stops(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    return sorted(set(eos if isinstance(eos, list) else [eos]) | {tokenizer.pad_token_id})


class RecordingGreedy(GreedyChooser):
    """The argmax, keeping each row's logits at every step it ran."""

    def __init__(self) -> None:
        self.logits: dict[int, list] = {}

    def __call__(self, logits, rows):
        for row, scores in zip(rows.tolist(), logits, strict=True):
            self.logits.setdefault(row, []).append(scores.clone())
        return super().__call__(logits, rows)


def test_a_layout_runs_each_distinct_prompt_once_and_shares_their_common_start():
    layout = PrefixLayout.of([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 4], [1, 2, 5]])
    assert layout.uniques == [[1, 2, 3, 4], [1, 2, 5]]
    assert layout.row_to_unique == [0, 1, 0, 1]
    assert layout.shared == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # the last token starts each row's decoding
    assert shared_prefix_length([[7, 8, 9]]) == 2
    assert shared_prefix_length([[1, 2], [3, 2]]) == 0


def test_every_row_gets_the_logits_it_gets_alone(tiny):
    import torch

    model, tokenizer, rows = tiny
    assert len({len(row) for row in rows}) > 1 and shared_prefix_length(rows) > 100
    batch = [rows[0], rows[1], rows[0], rows[2]]  # a repeated prompt, prompts of other lengths
    together = RecordingGreedy()
    with torch.no_grad():
        completions = sample_rows(
            model, batch, max_new_tokens=6, pad_token_id=tokenizer.pad_token_id, stop_token_ids=[], choose=together
        )
        for index, row in enumerate(batch):
            alone = model.generate(
                input_ids=torch.tensor([row]), do_sample=False, max_new_tokens=6, output_logits=True,
                return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=None,
            )
            assert completions[index] == alone.sequences[0, len(row):].tolist()
            for step_together, step_alone in zip(together.logits[index], alone.logits, strict=True):
                torch.testing.assert_close(step_together, step_alone[0], rtol=1e-4, atol=1e-4)


def test_rows_stop_at_their_own_stop_token_and_the_rest_keep_going(tiny):
    """Stopped rows leave the cache (it is compacted); the rows still running are unaffected."""
    import torch

    model, tokenizer, rows = tiny
    greedy = []
    with torch.no_grad():
        for row in rows:
            greedy.append(sample_rows(
                model, [row], max_new_tokens=8, pad_token_id=tokenizer.pad_token_id, stop_token_ids=[],
                choose=GreedyChooser(),
            )[0])
        # Make row 1's third greedy token a stop token: it ends there, the others run to the cap.
        stop = greedy[1][2]
        batch = [rows[0], rows[1], rows[2], rows[1]]
        completions = sample_rows(
            model, batch, max_new_tokens=8, pad_token_id=tokenizer.pad_token_id, stop_token_ids=[stop],
            choose=GreedyChooser(),
        )
    for row, completion in zip([0, 1, 2, 1], completions, strict=True):
        expected = greedy[row]
        cut = next((i + 1 for i, token in enumerate(expected) if token == stop), len(expected))
        assert completion == expected[:cut]


def test_the_warped_sampler_draws_what_generate_draws_with_the_same_seed(tiny):
    import torch

    model, tokenizer, rows = tiny
    with torch.no_grad():
        torch.manual_seed(7)
        ours = sample_rows(
            model, [rows[2]], max_new_tokens=10, pad_token_id=tokenizer.pad_token_id,
            stop_token_ids=_stops(model, tokenizer), choose=WarpedSampler(1.0),
        )[0]
        torch.manual_seed(7)
        theirs = model.generate(
            input_ids=torch.tensor([rows[2]]), do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=10,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=_stops(model, tokenizer),
        )[0, len(rows[2]):].tolist()
    assert ours == theirs[: len(ours)] and (len(ours) == len(theirs) or theirs[len(ours)] == tokenizer.pad_token_id)


def test_a_seeded_row_draws_the_same_text_in_any_batch(tiny):
    import torch

    model, tokenizer, rows = tiny

    def sample(batch_rows, seeds):
        with torch.no_grad():
            return sample_rows(
                model, batch_rows, max_new_tokens=10, pad_token_id=tokenizer.pad_token_id,
                stop_token_ids=_stops(model, tokenizer), choose=SeededGumbelSampler(seeds, 1.0, "cpu"),
            )

    together = sample(rows, [11, 12, 13])
    assert sample(rows, [11, 12, 13]) == together
    assert [sample([row], [seed])[0] for row, seed in zip(rows, [11, 12, 13], strict=True)] == together
    assert sample(rows, [21, 22, 23]) != together


def test_bad_arguments_are_refused(tiny):
    model, tokenizer, rows = tiny
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1"):
        sample_rows(model, rows, max_new_tokens=0, pad_token_id=0, stop_token_ids=[], choose=GreedyChooser())
    with pytest.raises(ValueError, match="positive temperature"):
        WarpedSampler(0.0)
    assert sample_rows(model, [], max_new_tokens=4, pad_token_id=0, stop_token_ids=[], choose=GreedyChooser()) == []
