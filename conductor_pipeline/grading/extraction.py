"""Pull the final answer out of a model response, and normalise gold answers.

Everything here is regexes, brace counting and string slicing over untrusted text: nothing in a
response is evaluated or parsed as an expression.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from conductor_pipeline.grading.json_answer import json_answer_field

# Only this tail of a response is searched for "final answer is X" / "Answer: X" and for a
# closing math span.
TRAILING_PHRASE_WINDOW = 600
# Boxes are read together when at most this much text, all of it list punctuation, separates them.
MAX_BOX_GAP_CHARS = 40
# A "final answer is X" after the last box replaces the box only when X is a short value.
MAX_SENTENCE_ANSWER_CHARS = 80
# A response this short, on one line and without prose, is itself the answer ("42", "\frac{1}{2}").
MAX_BARE_ANSWER_CHARS = 40
# End-of-turn tokens are looked for in this tail of a response.
TEMPLATE_TAIL_WINDOW = 120
# A closing math span longer than this is a derivation, not an answer.
MAX_SPAN_ANSWER_CHARS = 400

# --- extraction --------------------------------------------------------------------------------

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.DOTALL)
_HASH_RE = re.compile(r"####\s*([^\n]*)")
_TRAILING_PHRASE_RE = re.compile(r"(?:final\s+answer\s*(?:is|:)|\banswer\s*(?:is|:))\s*:?\s*", re.IGNORECASE)
_FINAL_ANSWER_RE = re.compile(r"final\s+answer\s*(?:is|:)\s*:?\s*", re.IGNORECASE)
# Two words in a row (not LaTeX commands): a sentence, not an answer.
PROSE_RE = re.compile(r"(?<![\\a-zA-Z])[A-Za-z]{3,}\s+[A-Za-z]{2,}")
_BLANK_LINE_RE = re.compile(r"\n[ \t]*\n")
_LATEX_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")
# Words that may join boxes listing one answer ("\\boxed{(3, 3)} \\text{ for part (a) and } ...").
_LIST_WORDS = frozenset({"and", "or", "for", "part", "parts"})
_TEXT_COMMAND_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{[^{}]*\}")
# A chat template's end-of-turn token and the role that follows it: the model stopped there.
_TEMPLATE_TAIL_RE = re.compile(r"(?:<\|[A-Za-z_]{1,30}\|>\s*(?:user|assistant|system)?\s*)+$")
# What opens or closes a math span: escapes (``\\(``, ``\\$``), dollar signs, blank lines.
_MATH_TOKEN_RE = re.compile(r"\\.|\$\$|\$|\n[ \t]*\n", re.DOTALL)
_MATH_OPENERS = {"\\(": "\\)", "\\[": "\\]"}


def balanced_brace_end(text: str, open_index: int) -> int | None:
    """Index just past the brace group opening at ``open_index`` (escaped braces ignored)."""
    depth = 0
    index = open_index
    length = len(text)
    while index < length:
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return None


class BoxGroup(NamedTuple):
    """The closing boxed answer: its text, where its last box starts and where the group ends."""

    answer: str
    last_start: int
    end: int
    boxes: int  # how many distinct boxes were read together


def _brace_group_ends(text: str, start: int) -> dict[int, int]:
    """Index of each ``{`` from ``start`` on -> index just past its matching ``}`` (escaped braces
    ignored). One pass, so many unclosed boxes cost no more than one."""
    opened: list[int] = []
    ends: dict[int, int] = {}
    for token in _BRACE_TOKEN_RE.finditer(text, start):
        if token.group() == "{":
            opened.append(token.start())
        elif token.group() == "}" and opened:
            ends[opened.pop()] = token.end()
    return ends


def _complete_boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every ``\\boxed{...}`` / ``\\fbox{...}`` whose braces close."""
    matches = list(_BOXED_RE.finditer(text))
    if not matches:
        return []
    ends = _brace_group_ends(text, matches[0].start())
    boxes = []
    for match in matches:
        end = ends.get(match.end() - 1)
        if end is not None:
            boxes.append((match.start(), end, text[match.end() : end - 1]))
    return boxes


def _separates_boxes(between: str) -> bool:
    """Whether the text between two boxes only lists them (``, ``, ``and``, ``\\quad``, ``y_2 =``).

    Prose, a paragraph break or a long gap means the boxes are separate statements, e.g. a draft
    result and then the final one.
    """
    if len(between) > MAX_BOX_GAP_CHARS or _BLANK_LINE_RE.search(between):
        return False
    words = _WORD_RE.findall(_LATEX_COMMAND_RE.sub(" ", between))
    return all(word.lower() in _LIST_WORDS for word in words)


def _final_boxes(text: str) -> BoxGroup | None:
    """The last complete box, read together with the boxes listed right before it.

    "the roots are \\boxed{-2} and \\boxed{3}" is one answer, ``-2, 3``; a box separated from
    the last one by prose is an earlier statement and is not part of the answer. Repeated
    identical boxes count once.
    """
    boxes = _complete_boxes(text)
    if not boxes:
        return None
    last_start, end, content = boxes[-1]
    contents = [content.strip()]
    group_start = last_start
    for start, box_end, earlier in reversed(boxes[:-1]):
        if box_end > group_start:
            continue  # a box enclosing one already read
        if not _separates_boxes(text[box_end:group_start]):
            break
        contents.insert(0, earlier.strip())
        group_start = start
    listed = list(dict.fromkeys(part for part in contents if part))
    return BoxGroup(", ".join(listed) if listed else content, last_start, end, max(1, len(listed)))


def _clean(answer: str | None) -> str | None:
    """Trim wrappers that carry no meaning; empty answers are no answers."""
    if answer is None:
        return None
    answer = answer.strip().strip("*").strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "\"'`":
        answer = answer[1:-1].strip()
    answer = answer.rstrip(". \n\t")  # sentence punctuation, never part of the value
    return answer or None


def _sentence_value(text: str, start: int) -> str:
    """What a marker at ``start`` introduces: the rest of its line, up to the sentence's full stop.

    A full stop counts only outside ``$...$`` and when blank or the line's end follows it, so
    "3.5" and "$x = 1.$" stay whole while "10. I hope it is correct." gives "10".
    """
    line_end = text.find("\n", start)
    line = text[start:] if line_end == -1 else text[start:line_end]
    in_math = False
    index = 0
    while index < len(line):
        char = line[index]
        if char == "\\":
            index += 2
            continue
        if char == "$":
            in_math = not in_math
        elif char == "." and not in_math and (index + 1 == len(line) or line[index + 1].isspace()):
            return line[:index]
        index += 1
    return line


def _trailing_phrase(response: str) -> str | None:
    """The value of the last "final answer is X" / "Answer: X" near the end of the response."""
    tail = response[-TRAILING_PHRASE_WINDOW:]
    for phrase in reversed(list(_TRAILING_PHRASE_RE.finditer(tail))):
        value = _clean(_sentence_value(tail, phrase.end()))
        if value is not None:
            return value
    return None


def _closing_final_answer(response: str, after: int) -> str | None:
    """A "final answer is X" sentence after position ``after`` (the last box), when X is a value.

    A model that boxes an intermediate result and then states its final answer means the
    statement; a marker followed by prose ("the final answer is found by ...") is not one.
    """
    markers = list(_FINAL_ANSWER_RE.finditer(response, after))
    if not markers:
        return None
    value = _clean(_sentence_value(response, markers[-1].end()))
    if (
        value is None
        or len(value) > MAX_SENTENCE_ANSWER_CHARS
        or '"' in value
        or "`" in value
        or PROSE_RE.search(_TEXT_COMMAND_RE.sub(" ", value))
    ):
        return None
    return value


def _without_template_tail(response: str) -> str:
    """The response without a trailing end-of-turn token (``<|im_start|>user``) or blanks.

    Only the last `TEMPLATE_TAIL_WINDOW` characters are searched, so the regex stays cheap.
    """
    text = response.rstrip()
    head, tail = text[:-TEMPLATE_TAIL_WINDOW], text[-TEMPLATE_TAIL_WINDOW:]
    return (head + _TEMPLATE_TAIL_RE.sub("", tail)).rstrip()


def _last_math_span(text: str) -> tuple[int, int, int] | None:
    """(content start, content end, span end) of the last complete math span, pairing delimiters
    from the start of the text: ``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``.

    A blank line closes nothing and ends any open span: TeX reads a single line break inside math
    as a space but rejects a paragraph break, so an unpaired "$" (a price) stays text.
    """
    last = None
    closer: str | None = None
    content_start = 0
    for token in _MATH_TOKEN_RE.finditer(text):
        mark = token.group()
        if mark[0] == "\\":
            if closer is None and mark in _MATH_OPENERS:
                closer, content_start = _MATH_OPENERS[mark], token.end()
            elif mark == closer:
                last, closer = (content_start, token.start(), token.end()), None
        elif mark[0] == "$":
            if closer is None:
                closer, content_start = mark, token.end()
            elif mark == closer or closer == "$":
                last, closer = (content_start, token.start(), token.end()), None
        elif closer in ("$", "\\)"):
            closer = None  # a blank line inside an inline span: it was never math
    return last


def _closing_math_span(response: str) -> str | None:
    """The content of a math span that ends the response ("... the pair is $(7, 6)$.").

    The span must be the last thing said, closed by a full stop, "!" or an end-of-turn token, or
    be (almost) all the response says; a derivation cut off right after an inline variable does
    not yield that variable. A span holding prose is two currency signs, not math.
    """
    text = _without_template_tail(response)
    ended_turn = len(text) < len(response.rstrip())
    if not text.rstrip(".!").rstrip().endswith(("$", "\\)", "\\]")):
        return None  # cheap refusal before pairing every delimiter of the text
    span = _last_math_span(text)
    if span is None:
        return None
    content_start, content_end, span_end = span
    after = text[span_end:].strip()
    if after not in ("", ".", "!"):
        return None
    if not (ended_turn or after or content_start <= MAX_BARE_ANSWER_CHARS):
        return None
    content = text[content_start:content_end]
    if len(content) > MAX_SPAN_ANSWER_CHARS or PROSE_RE.search(_TEXT_COMMAND_RE.sub(" ", content)):
        return None
    return _clean(content)


def _bare_answer(response: str) -> str | None:
    """A response that is nothing but a short answer: one line, no prose, no JSON."""
    if len(response) > 4 * MAX_BARE_ANSWER_CHARS:
        return None
    text = _without_template_tail(response)
    if len(text) > MAX_BARE_ANSWER_CHARS or "\n" in text or '"' in text or PROSE_RE.search(text):
        return None
    return _clean(text)


class Reading(NamedTuple):
    """An extracted answer and the rule of `extract_answer` that found it (see `RULES`)."""

    answer: str | None
    rule: str


# The rules of `extract_answer`, in the order they are tried.
RULES = (
    "boxes",  # several boxes listed together, read as one answer
    "box",  # the last box
    "final_answer_after_box",  # a "final answer is X" sentence after the last box
    "json_box",  # a box inside the JSON answer field
    "json",  # the JSON answer field
    "hash",  # "#### X"
    "phrase",  # a trailing "final answer is X" / "Answer: X"
    "closing_span",  # a math span that ends the response
    "bare",  # the whole (short) response
    "none",
)


def read_answer(response: str | None) -> Reading:
    """The final answer in a model response and the rule that found it.

    Order:
    1. the last ``\\boxed{}``/``\\fbox{}``, read together with the boxes listed right before
       it (``\\boxed{-2} and \\boxed{3}`` gives ``-2, 3``), unless a "final answer is X"
       sentence follows it, which wins;
    2. else the JSON ``"answer"`` field (a box inside the JSON is read from the decoded JSON
       text, so ``"\\\\boxed{\\\\frac{1}{2}}"`` yields ``\\frac{1}{2}``);
    3. else the value after the last ``####``;
    4. else a trailing "final answer is X" / "Answer: X";
    5. else a math span that closes the response, or a response that is only a short answer.
    """
    if not response:
        return Reading(None, "none")
    field = json_answer_field(response)
    boxed = _final_boxes(response)
    if boxed is not None:
        if field is not None and boxed.last_start < field[2]:
            # The box is inside the JSON text, so its backslashes are JSON-escaped. The answer
            # field is the model's declared final answer: prefer a box inside it, else the field.
            inner = _final_boxes(field[0])
            if inner is not None:
                return Reading(_clean(inner.answer), "json_box")
            return Reading(_clean(field[0]), "json")
        stated = _closing_final_answer(response, boxed.end)
        if stated is not None:
            return Reading(stated, "final_answer_after_box")
        return Reading(_clean(boxed.answer), "boxes" if boxed.boxes > 1 else "box")
    if field is not None:
        return Reading(_clean(field[0]), "json")
    hashes = list(_HASH_RE.finditer(response))
    if hashes:
        value = _clean(hashes[-1].group(1))
        if value:
            return Reading(value, "hash")
    for rule, read in (("phrase", _trailing_phrase), ("closing_span", _closing_math_span), ("bare", _bare_answer)):
        value = read(response)
        if value is not None:
            return Reading(value, rule)
    return Reading(None, "none")


def extract_answer(response: str | None) -> str | None:
    """The final answer in a model response, or None when it states none (rules: `read_answer`)."""
    return read_answer(response).answer


# --- normalisation and fast paths --------------------------------------------------------------

# A plain number: optional sign, digits with optional thousands commas, optional decimals.
PLAIN_NUMBER_RE = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$|^[+-]?\.\d+$")
_GOLD_PREFIX_RE = re.compile(r"^\s*#+\s*")


def normalize_gold(gold: str) -> str:
    """Gold as an answer string: ``# 18`` / ``#### 1,000`` -> ``18`` / ``1000``."""
    value = _GOLD_PREFIX_RE.sub("", gold).strip()
    if PLAIN_NUMBER_RE.match(value):
        value = value.replace(",", "")
    return value
