"""The `"answer": value` field of the non-strict JSON that real models write (ZeroEval's output
format), read with string scanning: raw newlines inside strings, unescaped LaTeX backslashes, bare
numbers and trailing prose are common, so `json.loads` would reject most of it; nothing is evaluated.
"""

from __future__ import annotations

import re

# Models sometimes quote a whole JSON answer inside the answer string; unwrap this many levels.
MAX_NESTED_JSON = 3

_ANSWER_KEY_RE = re.compile(r'(?<!\\)"answer"\s*:\s*', re.IGNORECASE)
# The same key on lower-cased text, without the look-behind: a pattern that starts with a plain literal
# is searched for about four times faster; the escaped-quote case is filtered out after.
_LOWER_ANSWER_KEY_RE = re.compile(r'"answer"\s*:\s*')
# JSON escapes that would turn LaTeX commands (\frac, \theta, \beta, \right, \neq) into control
# characters when a model forgot to double the backslash.
_CONTROL_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_PLACEHOLDER_RE = re.compile(r"^[\s_.…]*$")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/"}


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


def _answer_keys(text: str) -> list[re.Match[str]]:
    """Every `"answer":` key of the text not escaped by a backslash, in any letter case (what
    `_ANSWER_KEY_RE` finds). Lower-casing keeps every offset when it keeps the length (it never
    shortens text), so the matches on the lowered copy index the text."""
    lowered = text.lower()
    if len(lowered) != len(text):
        return list(_ANSWER_KEY_RE.finditer(text))
    keys = _LOWER_ANSWER_KEY_RE.finditer(lowered)
    return [m for m in keys if m.start() == 0 or text[m.start() - 1] != "\\"]


def json_answer_field(text: str, depth: int = 0) -> tuple[str, int, int] | None:
    """The last ``"answer": value`` in the text, decoded, with the span of its raw value.

    Works on the non-strict JSON real models write (raw newlines inside strings, unescaped
    LaTeX backslashes, bare numbers, trailing prose) instead of calling ``json.loads``.
    """
    for match in reversed(_answer_keys(text)):
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
                nested = json_answer_field(value, depth + 1)  # a JSON answer quoted as a string
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
