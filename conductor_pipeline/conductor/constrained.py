"""Constrained decoding of a conductor's workflow: every sampled completion is one that parses.

The paper's reward gives an unparseable workflow 0 against 0.5 for a parsed wrong one, so a small
policy whose long workflows (a fan-out to several workers and a vote) fail to parse more often than
one-step ones learns "short workflows parse" before any group can show what a fan-out is worth; and
a policy that writes a worker its prompt does not show gets a whole group of zeros, no gradient.
Structured generation removes both: the sampler may only pick a token that keeps the completion a
prefix of a workflow `parse_workflow` accepts against the workers *that prompt* shows.

The accepted language is the canonical lists form `render_workflow` writes, nothing before it:

    model_id = ["gpt-4o", "majority-vote"]
    subtasks = ["Solve the problem.", "Compare the solutions."]
    access_list = [[], "all"]

with 1 to `max_steps` entries, the same count in all three lists, worker names of the prompt's
catalogue (or their indices), non-empty JSON strings on one line, and access entries `[]`, `"all"`
or earlier step numbers. A stop token is allowed only once the last list is closed.

`WorkflowGrammar` tracks one completion character by character; `ConstrainedChooser` wraps any
sampler of `conductor.generation` and takes, per row, the highest-scoring allowed token of the
sampler's own perturbed scores, which is an exact sample of the sampler's distribution renormalised
over the allowed tokens. `workflow_regex` is the same language as a regular expression, for vLLM's
structured outputs (one catalogue for every prompt: the union of the names shown).
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conductor_pipeline.pools.backends.vote import MIN_VOTE_INPUTS
from conductor_pipeline.workflow import ALL, DEFAULT_MAX_STEPS, LIST_KEYS

# The fixed text between the lists (and before the first), exactly as `render_workflow` writes it.
OPENINGS = tuple(f"{'' if i == 0 else ']' + chr(10)}{key} = [" for i, key in enumerate(LIST_KEYS))
SEPARATOR = ", "
JSON_ESCAPES = frozenset('"\\/bfnrt')
QUOTED_ALL = json.dumps(ALL)
# Candidates per row tried from the sampler's top scores before scanning the whole vocabulary.
TOP_CANDIDATES = 16


@dataclass(frozen=True)
class State:
    """Where a completion is in the grammar.

    `part`: which list is being written (0 model_id, 1 subtasks, 2 access_list; 3 when done);
    `pending`: fixed text that must come next; `count`: entries of this list finished; `steps`: the
    model_id list's length, fixed once it is closed; `entry`: the entry being written ("" between
    entries), including its opening quote or bracket; `vote`: the step an aggregator takes, if any;
    `used`: the catalogue positions of the workers named so far (kept under `fan_outs_only` only).
    """

    part: int = 0
    pending: str = OPENINGS[0]
    count: int = 0
    steps: int = 0
    entry: str = ""
    vote: int | None = None
    used: frozenset[int] = frozenset()

    @property
    def done(self) -> bool:
        return self.part == len(LIST_KEYS)


class WorkflowGrammar:
    """The workflows that parse against one catalogue (`displayed`: the names a prompt shows).

    `aggregators` (displayed names of vote seats) may only aggregate: such a seat is the last step,
    after at least `MIN_VOTE_INPUTS` others, and sees at least that many of them (a vote over fewer
    only repeats its first answer, over none it answers nothing), the rule the warm start's targets keep.
    With `fan_outs_only`, on a catalogue that shows an aggregator and enough other workers, a workflow
    of more than one step is a fan-out of distinct workers the aggregator closes: calling a second
    worker is then the same choice as voting, and a chain (whose answer is its last worker's) cannot
    share, and drag down, that choice's credit; a worker named twice would only count its answer
    twice (on replay it is the same recorded answer). Its solvers answer independently (access `[]`:
    earlier answers in a solver's prompt are paid for as input tokens and make the answers it votes
    over less independent) and the aggregator sees every one of them. The warm start's
    `fan_out_only` targets have the same shapes.
    """

    def __init__(
        self,
        displayed: Sequence[str],
        max_steps: int = DEFAULT_MAX_STEPS,
        aggregators: Collection[str] = (),
        *,
        fan_outs_only: bool = False,
    ):
        if not displayed:
            raise ValueError("a workflow grammar needs at least one worker name")
        self.displayed = list(displayed)
        self.max_steps = max_steps
        self.aggregators = frozenset(aggregators) & set(self.displayed)
        solvers = [name for name in self.displayed if name not in self.aggregators]
        self.fan_outs_only = (
            fan_outs_only and bool(self.aggregators) and len(solvers) >= MIN_VOTE_INPUTS and max_steps > MIN_VOTE_INPUTS
        )
        quoted = {name: json.dumps(name, ensure_ascii=False) for name in self.displayed}
        self._aggregator_entries = frozenset(quoted[name] for name in self.aggregators) | {
            str(index) for index, name in enumerate(self.displayed) if name in self.aggregators
        }
        self._names = frozenset(quoted.values())
        self._name_prefixes = _prefixes(quoted.values())
        # Where an aggregator may not stand (too few steps before it), only a solver's name may be begun;
        # where only one may (a fan-out's last place), only an aggregator's.
        self._solver_prefixes = _prefixes(q for name, q in quoted.items() if name not in self.aggregators)
        self._aggregator_prefixes = _prefixes(quoted[name] for name in self.aggregators)
        self._quoted = [quoted[name] for name in self.displayed]
        self._position = {entry: index for index, entry in enumerate(self._quoted)}
        self._unused_solver_prefixes: dict[frozenset[int], frozenset[str]] = {}

    def start(self) -> State:
        return State()

    def advance(self, state: State, text: str) -> State | None:
        """The state after `text`, or None when no accepted workflow starts with what came before and `text`."""
        for char in text:
            state = self._step(state, char)
            if state is None:
                return None
        return state

    def accepts(self, text: str) -> bool:
        """Whether `text` is a whole accepted workflow."""
        state = self.advance(self.start(), text)
        return state is not None and state.done

    # --- one character -------------------------------------------------------------------------

    def _step(self, state: State, char: str) -> State | None:
        if state.pending:
            if char != state.pending[0]:
                return None
            return State(state.part, state.pending[1:], state.count, state.steps, state.entry, state.vote, state.used)
        if state.done:
            return None
        if not state.entry:  # between entries: the next entry's first character, or the list's end
            return self._entry_start(state, char)
        return (self._worker, self._subtask, self._access)[state.part](state, char)

    def _entry_start(self, state: State, char: str) -> State | None:
        if state.part == 0:
            if char == '"' or (char.isdigit() and self._index_may_start(state, char)):
                return self._entry(state, char)
            return None
        if state.part == 1:
            return self._entry(state, char) if char == '"' else None
        if self._solves_independently(state):
            return self._entry(state, char) if char == "[" else None
        if char == "[" or char == '"':
            return self._entry(state, char)
        return None

    def _solves_independently(self, state: State) -> bool:
        """Whether the access entry being written is a fan-out solver's, which must be `[]`."""
        return self.fan_outs_only and state.vote is not None and state.count != state.vote

    @staticmethod
    def _entry(state: State, entry: str) -> State:
        return State(state.part, "", state.count, state.steps, entry, state.vote, state.used)

    def _end_entry(self, state: State, char: str) -> State | None:
        """`char` (a separator's comma or a closing bracket) right after a finished entry."""
        count, vote, used = state.count + 1, state.vote, state.used
        if state.part == 0 and state.entry in self._aggregator_entries:
            if state.count < MIN_VOTE_INPUTS or char != "]":  # an aggregator is the last step, after enough others
                return None
            vote = state.count
        elif state.part == 0 and self.fan_outs_only:
            if char == "]" and count > 1:  # a fan-out ends in the vote
                return None
            used = state.used | {self._entry_position(state.entry)}
        limit = self.max_steps if state.part == 0 else state.steps
        if char == ",":
            return State(state.part, SEPARATOR[1:], count, state.steps, "", vote, used) if count < limit else None
        if char != "]" or count < limit and state.part > 0:
            return None
        steps = count if state.part == 0 else state.steps
        part = state.part + 1
        pending = OPENINGS[part][1:] if part < len(LIST_KEYS) else ""
        return State(part, pending, 0, steps, "", vote)

    def _worker(self, state: State, char: str) -> State | None:
        entry = state.entry
        if entry[0] == '"':
            if entry in self._names:  # a whole quoted name: what follows ends the entry
                return self._end_entry(state, char)
            grown = entry + char
            return self._entry(state, grown) if grown in self._worker_prefixes(state) else None
        if char.isdigit():  # an index, no leading zero, inside the catalogue
            grown = entry + char
            ok = entry != "0" and self._index_may_start(state, grown)
            return self._entry(state, grown) if ok else None
        return self._end_entry(state, char)

    def _entry_position(self, entry: str) -> int:
        """The catalogue position a finished model_id entry (a quoted name or an index) names."""
        return self._position[entry] if entry.startswith('"') else int(entry)

    def _worker_prefixes(self, state: State) -> frozenset[str]:
        """The quoted names that may be begun at this place of the model_id list."""
        if not self.fan_outs_only:
            return self._solver_prefixes if state.count < MIN_VOTE_INPUTS else self._name_prefixes
        if state.count == self.max_steps - 1:
            return self._aggregator_prefixes
        solvers = self._unused_solver_prefixes.get(state.used)
        if solvers is None:
            solvers = _prefixes(
                entry for index, entry in enumerate(self._quoted)
                if index not in state.used and self.displayed[index] not in self.aggregators
            )
            self._unused_solver_prefixes[state.used] = solvers
        return solvers if state.count < MIN_VOTE_INPUTS else solvers | self._aggregator_prefixes

    def _index_may_start(self, state: State, digits: str) -> bool:
        """Whether an index entry may begin (or go on) with `digits`: it names a worker that may stand
        here, or a longer index could."""
        index = int(digits)
        if index >= len(self.displayed):
            return False
        is_aggregator = self.displayed[index] in self.aggregators
        if state.count < MIN_VOTE_INPUTS:
            allowed = not is_aggregator
        else:
            allowed = is_aggregator or not (self.fan_outs_only and state.count == self.max_steps - 1)
        allowed = allowed and index not in state.used
        return allowed or (digits != "0" and index * 10 < len(self.displayed))

    def _subtask(self, state: State, char: str) -> State | None:
        entry = state.entry
        if _closed_string(entry):  # what follows the closing quote ends the entry
            return self._end_entry(state, char)
        if _open_escape(entry):
            return self._entry(state, entry + char) if char in JSON_ESCAPES else None
        if char == '"':
            return self._entry(state, entry + char) if _has_content(entry) else None
        if char < " ":  # JSON strings hold no raw control characters
            return None
        return self._entry(state, entry + char)

    def _access(self, state: State, char: str) -> State | None:
        entry, step = state.entry, state.count
        if entry[0] == '"':
            if entry == QUOTED_ALL:
                return self._end_entry(state, char)
            grown = entry + char
            return self._entry(state, grown) if QUOTED_ALL.startswith(grown) else None
        # A list of earlier step numbers: "[", then numbers separated by ", ", then "]".
        if entry.endswith("]"):
            return self._end_entry(state, char)
        last = entry.rsplit(" ", 1)[-1].lstrip("[")
        if self._solves_independently(state) and char != "]":
            return None
        if char == "]":
            if step == state.vote:  # a vote sees enough steps (under fan_outs_only, every solver)
                seen = len(set(entry[1:].split(", "))) if entry != "[" else 0
                if seen < (step if self.fan_outs_only else MIN_VOTE_INPUTS):
                    return None
            return self._entry(state, entry + char) if entry == "[" or last.isdigit() else None
        if char == ",":
            return self._entry(state, entry + char) if last.isdigit() else None
        if char == " ":
            return self._entry(state, entry + char) if entry.endswith(",") else None
        if char.isdigit() and (entry.endswith(("[", " ")) or last.isdigit()):
            number = (last if last.isdigit() else "") + char
            return self._entry(state, entry + char) if last != "0" and int(number) < step else None
        return None


def _prefixes(words: Iterable[str]) -> frozenset[str]:
    """Every non-empty prefix of every word."""
    return frozenset(word[:i] for word in words for i in range(1, len(word) + 1))


def _closed_string(entry: str) -> bool:
    """Whether `entry`, a JSON string from its opening quote, has its closing quote."""
    return len(entry) > 1 and entry.endswith('"') and not _open_escape(entry[:-1])


def _open_escape(entry: str) -> bool:
    """Whether `entry` (a string being written) ends inside a backslash escape."""
    trailing = len(entry) - len(entry.rstrip("\\"))
    return trailing % 2 == 1


def _has_content(entry: str) -> bool:
    """Whether the JSON string written so far (`entry`, from its opening quote) holds a character
    that is not whitespace: `parse_workflow` refuses an empty or blank subtask."""
    try:
        value = json.loads(entry + '"')
    except json.JSONDecodeError:
        return False
    return bool(value.strip())


def grammar_of_prompt(
    messages: Sequence[Mapping[str, Any]], aggregators: Collection[str] = (), *, fan_outs_only: bool = False
) -> WorkflowGrammar:
    """The grammar of what parses against the catalogue and step limit a conductor prompt shows;
    `aggregators` are the pool's vote seats, as the prompt names them (`WorkflowGrammar`)."""
    from conductor_pipeline.conductor.prompt import shown_catalogue

    names, max_steps = shown_catalogue(messages)
    return WorkflowGrammar(names, max_steps, aggregators, fan_outs_only=fan_outs_only)


def grammars_of_prompts(
    prompts: Sequence[Sequence[Mapping[str, Any]]], aggregators: Collection[str] = (), *, fan_outs_only: bool = False
) -> list[WorkflowGrammar]:
    """Each prompt row's grammar, built once per distinct system message (a group's rows share one:
    a grammar holds no per-row state, the chooser does)."""
    built: dict[str, WorkflowGrammar] = {}
    grammars = []
    for messages in prompts:
        key = next((str(m["content"]) for m in messages if m.get("role") == "system"), "")
        if key not in built:
            built[key] = grammar_of_prompt(messages, aggregators, fan_outs_only=fan_outs_only)
        grammars.append(built[key])
    return grammars


class TokenTexts:
    """Each token id's text, as the completion's decoded text will hold it; None for special
    tokens that are not stop tokens (skipped in the decoded text, so never allowed)."""

    def __init__(self, tokenizer: Any, stop_token_ids: Sequence[int]):
        special = set(getattr(tokenizer, "all_special_ids", ())) | {
            index for index, token in getattr(tokenizer, "added_tokens_decoder", {}).items() if token.special
        }
        self.stops = frozenset(stop_token_ids)
        self.texts: list[str | None] = [
            None if index in special else tokenizer.decode([index]) for index in range(len(tokenizer))
        ]


class ConstrainedChooser:
    """A `TokenChooser` that lets each row pick only tokens its grammar allows (`grammars[row]`).

    `inner` is a sampler with a `scores(logits, rows)` method (the values whose argmax is its pick:
    logits, or logits plus Gumbel noise); the pick is the highest-scoring allowed token, the exact
    sample of the inner distribution restricted to the allowed tokens and renormalised.
    """

    def __init__(self, inner: Any, grammars: Sequence[WorkflowGrammar], vocabulary: TokenTexts):
        self.inner = inner
        self.grammars = list(grammars)
        self.states = [grammar.start() for grammar in self.grammars]
        self.vocabulary = vocabulary

    def __call__(self, logits: Any, rows: Any) -> Any:
        import torch

        scores = self.inner.scores(logits, rows)
        width = min(TOP_CANDIDATES, scores.shape[-1])
        top = scores.topk(width, dim=-1).indices.tolist()
        chosen = []
        for position, row in enumerate(rows.tolist()):
            token = self._first_allowed(row, top[position])
            if token is None:  # rare: scan the whole vocabulary in score order
                token = self._first_allowed(row, scores[position].argsort(descending=True).tolist())
            if token is None:
                raise RuntimeError(f"constrained decoding: no token continues row {row} from {self.states[row]}")
            chosen.append(token)
        return torch.tensor(chosen, device=logits.device)

    def _first_allowed(self, row: int, candidates: Sequence[int]) -> int | None:
        state, grammar = self.states[row], self.grammars[row]
        for token in candidates:
            if token in self.vocabulary.stops:
                if state.done:
                    return token
                continue
            text = self.vocabulary.texts[token]
            if not text:
                continue
            after = grammar.advance(state, text)
            if after is not None:
                self.states[row] = after
                return token
        return None


def workflow_regex(displayed: Sequence[str], max_steps: int = DEFAULT_MAX_STEPS) -> str:
    """`WorkflowGrammar`'s language over `displayed` as one regular expression (vLLM's structured
    outputs take a regex; it accepts the same texts, a test checks)."""
    names = "|".join(re.escape(json.dumps(name, ensure_ascii=False)) for name in displayed)
    indices = "|".join(str(i) for i in range(len(displayed)))
    worker = f"(?:{names}|{indices})"
    char = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt])'
    # A subtask holds a character that is not whitespace (str.isspace, as `parse_workflow` strips):
    # blanks, then that character, then anything. The first non-blank is the only place the split can
    # be, so a backtracking matcher never retries it (`{char}*{content}{char}*` is exponential in
    # the steps when a text fails), and no engine's own idea of `\s` is relied on.
    blank = f"(?:[{_blanks()}]|\\\\[fnrt])"
    content = f'(?:[^"\\\\\\x00-\\x1f{_blanks()}]|\\\\["\\\\/b])'
    subtask = f'"{blank}*{content}{char}*"'
    listed = re.escape(SEPARATOR).join
    alternatives = []
    for steps in range(1, max_steps + 1):
        access = [r'\[\]|"all"' + (f"|\\[(?:{_below(i)})(?:, (?:{_below(i)}))*\\]" if i else "") for i in range(steps)]
        parts = [
            re.escape(OPENINGS[0]) + listed([worker] * steps),
            re.escape(OPENINGS[1]) + listed([subtask] * steps),
            re.escape(OPENINGS[2]) + listed([f"(?:{a})" for a in access]) + r"\]",
        ]
        alternatives.append("".join(parts))
    return "(?:" + "|".join(alternatives) + ")"


@functools.cache
def _blanks() -> str:
    """Every character above the control range that str.isspace calls whitespace, as regex escapes."""
    return "".join(f"\\u{code:04x}" for code in range(0x20, sys.maxunicode + 1) if chr(code).isspace())


def _below(step: int) -> str:
    """A step number below `step`, as the grammar writes it (no leading zeros)."""
    return "|".join(str(i) for i in range(step))
