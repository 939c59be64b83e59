"""Pull the final answer out of a model response, and normalise gold answers."""

from __future__ import annotations

import re

# Models sometimes quote a whole JSON answer inside the answer string; unwrap this many levels.
MAX_NESTED_JSON = 3
# Only this tail of a response is searched for "final answer is X" / "Answer: X".
TRAILING_PHRASE_WINDOW = 600

# --- extraction --------------------------------------------------------------------------------

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_KEY_RE = re.compile(r'(?<!\\)"answer"\s*:\s*', re.IGNORECASE)
_HASH_RE = re.compile(r"####\s*([^\n]*)")
_TRAILING_PHRASE_RE = re.compile(
    r"(?:final\s+answer\s*(?:is|:)|\banswer\s*(?:is|:))\s*:?\s*([^\n]+)",
    re.IGNORECASE,
)
# JSON escapes that would turn LaTeX commands (\frac, \theta, \beta, \right, \neq) into control
# characters when a model forgot to double the backslash.
_CONTROL_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_PLACEHOLDER_RE = re.compile(r"^[\s_.…]*$")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/"}


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


def _last_boxed(text: str) -> tuple[str, int] | None:
    """Content and start of the last complete ``\\boxed{...}`` / ``\\fbox{...}``."""
    for match in reversed(list(_BOXED_RE.finditer(text))):
        end = balanced_brace_end(text, match.end() - 1)
        if end is not None:
            return text[match.end() : end - 1], match.start()
    return None


def _decode_json_string(body: str) -> str:
    """Decode a JSON string body the way a model meant it, not the way the spec reads it.

    Raw newlines are kept, invalid escapes such as ``\\(`` keep their backslash, and
    ``\\f``/``\\t``/``\\n``... followed by a letter stay LaTeX (``\\frac``, ``\\theta``).
    """
    out: list[str] = []
    index = 0
    length = len(body)
    while index < length:
        char = body[index]
        if char != "\\" or index + 1 >= length:
            out.append(char)
            index += 1
            continue
        nxt = body[index + 1]
        after = body[index + 2] if index + 2 < length else ""
        if nxt in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[nxt])
            index += 2
        elif nxt in _CONTROL_ESCAPES and not after.isalpha():
            out.append(_CONTROL_ESCAPES[nxt])
            index += 2
        elif nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[index + 2 : index + 6]):
            out.append(chr(int(body[index + 2 : index + 6], 16)))
            index += 6
        else:
            out.append("\\" + nxt)
            index += 2
    return "".join(out)


def _json_answer_field(text: str, depth: int = 0) -> tuple[str, int, int] | None:
    """The last ``"answer": value`` in the text, decoded, with the span of its raw value.

    Works on the non-strict JSON real models write (raw newlines inside strings, unescaped
    LaTeX backslashes, bare numbers, trailing prose) instead of calling ``json.loads``.
    """
    for match in reversed(list(_ANSWER_KEY_RE.finditer(text))):
        if text[max(0, match.start() - 8) : match.start()].endswith(("e.g.,`", "e.g., `")):
            continue  # the ZeroEval instruction's example (`"answer": "42"`) echoed back
        start = match.end()
        if start >= len(text):
            continue
        first = text[start]
        if first == '"':
            index = start + 1
            while index < len(text):
                if text[index] == "\\":
                    index += 2
                    continue
                if text[index] == '"':
                    break
                index += 1
            else:
                continue  # unterminated (truncated) string: not an answer
            value = _decode_json_string(text[start + 1 : index])
            if _PLACEHOLDER_RE.match(value):
                continue  # the prompt's template echoed back ("answer": "___")
            if depth < MAX_NESTED_JSON and _ANSWER_KEY_RE.search(value):
                nested = _json_answer_field(value, depth + 1)  # a JSON answer quoted as a string
                if nested is not None:
                    return nested[0], start, index + 1
            return value, start, index + 1
        if first in "{[":
            closer = "}" if first == "{" else "]"
            level = 0
            for index in range(start, len(text)):
                if text[index] == first:
                    level += 1
                elif text[index] == closer:
                    level -= 1
                    if level == 0:
                        return text[start : index + 1], start, index + 1
            continue
        line_end = text.find("\n", start)
        line_end = len(text) if line_end == -1 else line_end
        value = text[start:line_end].strip().rstrip(",").strip()
        if value.endswith("}") and "{" not in value:
            value = value.rstrip("}").strip()
        if value and value != "null":
            return value, start, line_end
    return None


def _clean(answer: str | None) -> str | None:
    """Trim wrappers that carry no meaning; empty answers are no answers."""
    if answer is None:
        return None
    answer = answer.strip().strip("*").strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "\"'`":
        answer = answer[1:-1].strip()
    answer = answer.rstrip(". \n\t")  # sentence punctuation, never part of the value
    return answer or None


def extract_answer(response: str) -> str | None:
    """The final answer in a model response, or None when it states none.

    Order: last ``\\boxed{}``/``\\fbox{}``; else the JSON ``"answer"`` field; else the value after
    the last ``####``; else a trailing "final answer is X" / "Answer: X".
    A ``\\boxed{}`` that sits inside the JSON object is read from the decoded JSON text, so
    ``"\\\\boxed{\\\\frac{1}{2}}"`` yields ``\\frac{1}{2}``.
    """
    if not response:
        return None
    field = _json_answer_field(response)
    boxed = _last_boxed(response)
    if boxed is not None:
        content, position = boxed
        if field is not None and position < field[2]:
            # The box is inside the JSON text, so its backslashes are JSON-escaped. The answer
            # field is the model's declared final answer: prefer a box inside it, else the field.
            inner = _last_boxed(field[0])
            return _clean(inner[0] if inner else field[0])
        return _clean(content)
    if field is not None:
        return _clean(field[0])
    hashes = list(_HASH_RE.finditer(response))
    if hashes:
        value = _clean(hashes[-1].group(1))
        if value:
            return value
    tail = response[-TRAILING_PHRASE_WINDOW:]
    phrases = list(_TRAILING_PHRASE_RE.finditer(tail))
    if phrases:
        return _clean(phrases[-1].group(1))
    return None


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
