"""Constrained decoding: the grammar accepts exactly workflows that parse against the catalogue a
prompt shows, its regex form agrees, and a real tiny model sampled through it writes nothing else."""

from __future__ import annotations

import random
import re

import pytest
import torch

from conductor_pipeline.conductor.constrained import (
    OPENINGS,
    ConstrainedChooser,
    TokenTexts,
    WorkflowGrammar,
    grammar_of_prompt,
    workflow_regex,
)
from conductor_pipeline.conductor.generation import GreedyChooser, SeededGumbelSampler, WarpedSampler, sample_rows
from conductor_pipeline.conductor.prompt import build_conductor_prompt, shown_catalogue
from conductor_pipeline.training.synthetic import synthetic_target
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.workflow import PARSE_OK, parse_code, parse_workflow

SEATS = ["gpt-4o", "claude-3.5-sonnet", "gemini-1.5-pro", "llama-3.1-8b", "majority-vote"]


def _workflow(workers: str, subtasks: str, access: str) -> str:
    return f"model_id = {workers}\nsubtasks = {subtasks}\naccess_list = {access}"


def test_the_prompt_tells_which_workers_it_shows_and_how_many_steps_a_workflow_may_have():
    for naming in ("names", "ordinal"):
        messages = build_conductor_prompt(
            "What is 2 + 2?", [("gpt-4o", "OpenAI's: a model"), ("llama-3.1-8b", "")], naming=naming, max_steps=4,
            predicted_success={"gpt-4o": 0.5, "llama-3.1-8b": 0.25},
        )
        names, steps = shown_catalogue(messages)
        assert names == (["gpt-4o", "llama-3.1-8b"] if naming == "names" else ["Model 0", "Model 1"])
        assert steps == 4
    with pytest.raises(ValueError, match="worker catalogue"):
        shown_catalogue([{"role": "user", "content": "Task: 2 + 2"}])


def test_every_warm_start_target_is_accepted_by_the_grammar_and_its_regex():
    rng = random.Random(0)
    for _ in range(300):
        shown = rng.sample(SEATS, rng.randint(2, len(SEATS)))
        grammar, regex = WorkflowGrammar(shown), re.compile(workflow_regex(shown))
        target = synthetic_target(rng, shown, naming="names", style="compact", aggregators=["majority-vote"])
        assert grammar.accepts(target) and regex.fullmatch(target), target


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (_workflow('["gpt-4o"]', '["a", "b"]', "[[]]"), "length_mismatch"),
        (_workflow('["gpt-5"]', '["a"]', "[[]]"), "unknown_worker"),
        (_workflow("[5]", '["a"]', "[[]]"), "unknown_worker"),
        (_workflow('["gpt-4o"]', '[" \\n "]', "[[]]"), "empty_subtask"),
        (_workflow('["gpt-4o", "gpt-4o"]', '["a", "b"]', "[[], [1]]"), "forward_dep"),
        (_workflow('["gpt-4o"]', '["a"]', "[[]"), "json_decode"),
        (_workflow(str(["gpt-4o"] * 6).replace("'", '"'), str(["a"] * 6).replace("'", '"'), str([[]] * 6)), "too_many_steps"),
    ],
)
def test_what_does_not_parse_is_refused_by_the_grammar_and_its_regex(text, code):
    assert parse_code(text, SEATS) == code
    assert not WorkflowGrammar(SEATS).accepts(text)
    assert not re.fullmatch(workflow_regex(SEATS), text)


@pytest.mark.parametrize(
    ("subtask", "parses"),
    [('"\\b"', True), ('"\\t\\n"', False), ('"\u00a0\u3000"', False), ('"\u2003x "', True), ('" \\/ "', True),
     ('"\ufeff"', True)],  # a byte-order mark is not whitespace to str.strip (it is to JavaScript's \s)
)
def test_a_subtask_is_blank_to_the_regex_exactly_when_it_is_blank_to_the_parser(subtask, parses):
    text = _workflow('["gpt-4o"]', f"[{subtask}]", "[[]]")
    assert (parse_code(text, SEATS) == PARSE_OK) is parses
    assert WorkflowGrammar(SEATS).accepts(text) is parses
    assert bool(re.fullmatch(workflow_regex(SEATS), text)) is parses


def test_indices_earlier_steps_and_escapes_are_accepted_where_they_parse():
    text = _workflow('[0, "majority-vote"]', '["Solve \\"it\\"\\\\boxed{}", "Vote."]', '["all", [0]]')
    assert parse_code(text, SEATS) == PARSE_OK
    assert WorkflowGrammar(SEATS).accepts(text) and re.fullmatch(workflow_regex(SEATS), text)
    grammar = WorkflowGrammar(SEATS)
    assert grammar.advance(grammar.start(), 'model_id = ["gpt-4o"') is not None
    assert grammar.advance(grammar.start(), 'model_id = ["gpt-4') is not None  # a prefix of a name
    assert grammar.advance(grammar.start(), 'model_id = ["gpt-4x') is None


def test_edits_of_valid_workflows_are_accepted_exactly_when_the_regex_matches_and_then_they_parse():
    rng = random.Random(1)
    alphabet = sorted(set("".join(SEATS)) | set('[]", \n\\01234abc'))
    for _ in range(1500):
        shown = rng.sample(SEATS, rng.randint(2, len(SEATS)))
        text = list(synthetic_target(rng, shown, naming="names", style="compact", aggregators=["majority-vote"]))
        for _ in range(rng.randint(1, 3)):  # delete, replace or insert a character
            at, edit = rng.randrange(len(text)), rng.randrange(3)
            if edit == 0:
                del text[at]
            else:
                text[at:at + (edit == 1)] = [rng.choice(alphabet)]
        edited = "".join(text)
        accepted = WorkflowGrammar(shown).accepts(edited)
        assert accepted == bool(re.fullmatch(workflow_regex(shown), edited)), edited
        if accepted:
            assert parse_code(edited, shown) == PARSE_OK, edited


class Scores(GreedyChooser):
    """Fixed scores for every row: the chooser's pick order is known."""

    def __init__(self, order: list[int], vocab: int):
        self.row = torch.zeros(vocab)
        for rank, token in enumerate(order):
            self.row[token] = float(len(order) - rank)

    def scores(self, logits, rows):
        return self.row.expand(len(rows), -1)


class Texts(TokenTexts):
    def __init__(self, texts: list[str | None], stops: list[int]):
        self.texts, self.stops = texts, frozenset(stops)


def test_the_chooser_takes_the_best_scored_token_the_grammar_allows_and_a_stop_only_at_the_end():
    vocab = ['model_id = ["', "gpt-4o", '"]\nsubtasks = ["', "Solve.", '"]\naccess_list = [[]]', "\n]", None]
    texts = Texts(vocab + ["<stop>"], stops=[7])
    # The stop and a line break score highest throughout: they are allowed only where they fit.
    chooser = ConstrainedChooser(Scores([7, 5, 6, 4, 3, 2, 1, 0], 8), [WorkflowGrammar(["gpt-4o"])], texts)
    picked = [int(chooser(torch.zeros(1, 8), torch.tensor([0]))[0]) for _ in range(6)]
    assert picked == [0, 1, 2, 3, 4, 7]
    assert chooser.states[0].done


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_causal_lm(tmp_path_factory.mktemp("tiny") / "model")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("sampler", ["warped", "seeded"])
def test_an_untrained_model_sampled_through_the_grammar_writes_only_workflows_that_parse(tiny, sampler):
    """A random-weight policy almost never writes a workflow; held to the grammar, every completion
    is a prefix of one (it may run out of tokens first) and every one it finishes parses."""
    model, tokenizer = tiny
    rng = random.Random(2)
    prompts = [build_conductor_prompt(f"What is {i} + {i}?", rng.sample(SEATS, 3), naming="names") for i in range(6)]
    rows = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
            for p in prompts]
    eos = model.generation_config.eos_token_id
    stops = sorted(set(eos if isinstance(eos, list) else [eos]) | {tokenizer.pad_token_id})
    vocabulary = TokenTexts(tokenizer, stops)

    def sample(choose):
        torch.manual_seed(0)
        with torch.no_grad():
            return sample_rows(model, rows, max_new_tokens=160, pad_token_id=tokenizer.pad_token_id,
                               stop_token_ids=stops, choose=choose)

    inner = WarpedSampler(1.0) if sampler == "warped" else SeededGumbelSampler(range(len(rows)), 1.0, "cpu")
    grammars = [grammar_of_prompt(p, ["majority-vote"]) for p in prompts]
    completions = sample(ConstrainedChooser(inner, grammars, vocabulary))
    finished = 0
    for tokens, grammar, prompt in zip(completions, grammars, prompts, strict=True):
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        assert grammar.advance(grammar.start(), text) is not None, text
        if tokens[-1] in stops:
            finished += 1
            assert parse_code(text, shown_catalogue(prompt)[0]) == PARSE_OK, text
    unconstrained = sample(WarpedSampler(1.0))
    assert not any(
        grammar.advance(grammar.start(), tokenizer.decode(tokens, skip_special_tokens=True))
        for tokens, grammar in zip(unconstrained, grammars, strict=True)
    ), "the untrained model should not write workflows by itself, or this test shows nothing"
    assert finished or all(len(tokens) == 160 for tokens in completions)


def test_vllm_gets_one_regex_over_every_name_the_prompts_show():
    from conductor_pipeline.training.grpo import structured_outputs_regex

    rows = [{"prompt": build_conductor_prompt("q", seats, naming="names")}
            for seats in (["gpt-4o", "llama-3.1-8b"], ["claude-3.5-sonnet", "majority-vote"])]
    regex = re.compile(structured_outputs_regex(rows))
    assert regex.fullmatch(_workflow('["gpt-4o", "majority-vote"]', '["Solve.", "Vote."]', '[[], "all"]'))
    assert not regex.fullmatch(_workflow('["gemini-1.5-pro"]', '["Solve."]', "[[]]"))


@pytest.mark.parametrize(
    ("workers", "access", "accepted"),
    [
        ('["gpt-4o", "llama-3.1-8b", "claude-3.5-sonnet", "majority-vote"]', '[[], [], [], "all"]', True),
        ('[0, 3, 1, 4]', "[[], [], [], [0, 1, 2]]", True),
        # A vote over two only repeats the first answer (the tie goes to the earlier step).
        ('["gpt-4o", "llama-3.1-8b", "majority-vote"]', '[[], [], "all"]', False),
        ('["gpt-4o", "llama-3.1-8b", "claude-3.5-sonnet", "majority-vote"]', "[[], [], [], [0, 2]]", False),
        ('["gpt-4o", "llama-3.1-8b", "claude-3.5-sonnet", "majority-vote"]', "[[], [], [], [1, 1, 2]]", False),
        ('["gpt-4o", "llama-3.1-8b", "majority-vote"]', "[[], [], [1]]", False),  # a vote over one answer
        ('["gpt-4o", "llama-3.1-8b", "majority-vote"]', "[[], [], []]", False),  # over none: no answer
        ('["gpt-4o", "majority-vote", "llama-3.1-8b"]', '[[], "all", "all"]', False),  # not last, after one
        ('["majority-vote"]', "[[]]", False),
    ],
)
def test_a_vote_seat_may_only_aggregate_three_or_more_earlier_steps(workers, access, accepted):
    subtasks = str(["Solve."] * workers.count(",") + ["Vote."]).replace("'", '"')
    text = _workflow(workers, subtasks, access)
    assert parse_code(text, SEATS) == PARSE_OK  # each of them parses: the rule is the pool's, not the parser's
    assert WorkflowGrammar(SEATS, aggregators=["majority-vote"]).accepts(text) == accepted
    assert WorkflowGrammar(SEATS).accepts(text)


def test_random_scores_never_lead_the_grammar_into_a_dead_end():
    """Whatever the scores, some token always continues: names whole or in pieces, a vote seat
    among them (the chooser raises if a row is left with no allowed token)."""
    pieces = sorted(set("".join(SEATS)) | set("".join(OPENINGS)) | set('[]", \n\\01234allbt'))
    texts = Texts([*pieces, *SEATS, *(f'"{name}"' for name in SEATS), 'model_id = ["', "<stop>"], stops=[])
    texts.stops = frozenset([len(texts.texts) - 1])
    rng = torch.Generator().manual_seed(3)
    for trial in range(40):
        shown = random.Random(trial).sample(SEATS, 4)
        grammar = WorkflowGrammar(shown, max_steps=4, aggregators=["majority-vote"])
        chooser = ConstrainedChooser(GreedyChooser(), [grammar], texts)
        text = ""
        for _ in range(400):
            token = int(chooser(torch.rand(1, len(texts.texts), generator=rng), torch.tensor([0]))[0])
            if token in texts.stops:
                break
            text += texts.texts[token]
        if chooser.states[0].done:
            assert parse_code(text, shown) == PARSE_OK and grammar.accepts(text), text
        else:
            assert grammar.advance(grammar.start(), text) is not None


@pytest.mark.parametrize(
    ("workers", "access", "accepted"),
    [
        ('["gpt-4o"]', "[[]]", True),
        ('["gpt-4o", "llama-3.1-8b", "claude-3.5-sonnet", "majority-vote"]', '[[], [], [], "all"]', True),
        ('[0, 3, 1, 4]', "[[], [], [], [0, 2, 1]]", True),
        # Solvers answer independently, and the vote sees every one of them.
        ('["gpt-4o", "llama-3.1-8b", "claude-3.5-sonnet", "gemini-1.5-pro", "majority-vote"]', '[[], [0], [], [], "all"]', False),
        ('["gpt-4o", "llama-3.1-8b", "claude-3.5-sonnet", "majority-vote"]', '[[], "all", [], "all"]', False),
        ('["gpt-4o", "llama-3.1-8b", "claude-3.5-sonnet", "gemini-1.5-pro", "majority-vote"]', '[[], [], [], [], [0, 1, 3]]', False),
        # A worker named twice counts its answer twice (on replay, the same recorded answer).
        ('["gpt-4o", "gpt-4o", "claude-3.5-sonnet", "majority-vote"]', '[[], [], [], "all"]', False),
        ('[0, 3, 0, 4]', "[[], [], [], [0, 1, 2]]", False),
        ('["gpt-4o", "llama-3.1-8b", "claude-3.5-sonnet", "llama-3.1-8b", "majority-vote"]', '[[], [], [], [], "all"]', False),
        # A chain: its answer is its last worker's, and it would share the vote's first choice.
        ('["gpt-4o", "llama-3.1-8b"]', "[[], [0]]", False),
        ('["gpt-4o", "llama-3.1-8b", "claude-3.5-sonnet"]', "[[], [], [0, 1]]", False),
        ('[0, 3, 1, 2]', "[[], [], [], []]", False),
    ],
)
def test_with_fan_outs_only_a_workflow_of_more_than_one_step_is_a_fan_out_of_distinct_workers_the_vote_closes(
    workers, access, accepted
):
    subtasks = str(["Solve."] * (workers.count(",") + 1)).replace("'", '"')
    text = _workflow(workers, subtasks, access)
    assert parse_code(text, SEATS) == PARSE_OK
    assert WorkflowGrammar(SEATS, aggregators=["majority-vote"], fan_outs_only=True).accepts(text) == accepted
    # Where no fan-out can be written (no vote seat shown, or fewer than three others), the rule is off.
    without_vote = WorkflowGrammar(SEATS[:4], aggregators=["majority-vote"], fan_outs_only=True)
    assert without_vote.accepts(text) == (parse_code(text, SEATS[:4]) == PARSE_OK)


def test_with_fan_outs_only_random_scores_write_single_steps_and_fan_outs_and_never_stall():
    """A five-step limit leaves four solvers and the vote; once four solvers are named only the vote
    may follow, and a named worker is not named again. Whatever the scores, the walk ends in a single
    step or a fan-out of distinct workers the vote closes."""
    pieces = sorted(set("".join(SEATS)) | set("".join(OPENINGS)) | set('[]", \n\\01234allbt'))
    texts = Texts([*pieces, *SEATS, *(f'"{name}"' for name in SEATS), 'model_id = ["', "<stop>"], stops=[])
    texts.stops = frozenset([len(texts.texts) - 1])
    rng = torch.Generator().manual_seed(5)
    shapes = set()
    for trial in range(40):
        shown = random.Random(trial).sample(SEATS, 5)
        grammar = WorkflowGrammar(shown, max_steps=5, aggregators=["majority-vote"], fan_outs_only=True)
        chooser = ConstrainedChooser(GreedyChooser(), [grammar], texts)
        text = ""
        for _ in range(600):
            token = int(chooser(torch.rand(1, len(texts.texts), generator=rng), torch.tensor([0]))[0])
            if token in texts.stops:
                break
            text += texts.texts[token]
        assert chooser.states[0].done, text
        workflow = parse_workflow(text, shown)
        names = [step.worker for step in workflow.steps]
        assert len(names) == 1 or (names[-1] == "majority-vote" and len(names) >= 4), text
        assert len(set(names)) == len(names), text
        if len(names) > 1:
            assert all(not step.sees for step in workflow.steps[:-1]), text
            assert set(workflow.steps[-1].sees) == set(range(len(names) - 1)), text
        shapes.add(len(names))
    assert shapes >= {1, 4, 5}
