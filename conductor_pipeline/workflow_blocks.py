"""Finding and decoding the last workflow block in a conductor's text (`conductor_pipeline.workflow`
validates what it returns).

Nothing is evaluated: JSON goes through `json` (C decoder); the three-list form through a small
iterative decoder for a subset of Python literals (lists, integers, single-line quoted strings),
with an explicit stack, so nesting depth cannot exhaust the interpreter's recursion limit.
Candidates are found by `str.find` of the workflow keywords and checked in place, each block is
decoded once and the scan resumes after it: work is (near) linear in the text.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter

# --- locating blocks -------------------------------------------------------------------------

# A JSON block starts with "{" whose first key is a workflow key; a list block is an assignment
# `model_id = [` not preceded by a word character or dot (so `my_model_id = [` does not count).
# Candidates are found by C-speed `str.find` of these keywords and then checked in place: one regex
# search over the whole text cost several times more on 2k characters of prose.
_KEYWORDS = ("model_id", "subtasks", "access_list", '"steps"')
_JSON_KEY_AT = re.compile(r'"(?:steps|model_id|subtasks|access_list)"\s*:')
_ASSIGNMENT_AT = re.compile(r"(?<![\w.])(?:model_id|subtasks|access_list)\s*=\s*(?=\[)")


def _candidate_at(text: str, at: int, keyword: str) -> tuple[str, int] | None:
    """What starts with the keyword found at `at`: ("json", index of "{") or ("lists", index of "[")."""
    key_start = at if keyword == '"steps"' else at - 1
    if key_start >= 0 and text[key_start] == '"' and _JSON_KEY_AT.match(text, key_start):
        brace = key_start - 1
        while brace >= 0 and text[brace].isspace():
            brace -= 1
        if brace >= 0 and text[brace] == "{":
            return "json", brace
    if keyword != '"steps"':
        assignment = _ASSIGNMENT_AT.match(text, at)
        if assignment is not None:
            return "lists", assignment.end()
    return None


# For a block that failed to decode: find where it ends, skipping quoted strings. Strings are
# scanned left to right once; an unclosed string or bracket means the block runs to the end.
_BRACKET_OR_QUOTE = re.compile(r"[\[\]{}\"']")
_STRING_REST = {
    '"': re.compile(r'(?:[^"\\]++|\\[\s\S])*+"'),
    "'": re.compile(r"(?:[^'\\]++|\\[\s\S])*+'"),
}


def _block_end(text: str, start: int) -> int:
    """End of the bracketed block opening at `start`: where its brackets balance or a closing
    bracket of the wrong kind appears; len(text) if it never closes."""
    open_brackets: list[str] = []
    pos = start
    while True:
        match = _BRACKET_OR_QUOTE.search(text, pos)
        if match is None:
            return len(text)
        char = match.group()
        pos = match.end()
        if char in "\"'":
            rest = _STRING_REST[char].match(text, pos)
            if rest is None:
                return len(text)
            pos = rest.end()
        elif char in "[{":
            open_brackets.append("]" if char == "[" else "}")
        elif not open_brackets or open_brackets.pop() != char or not open_brackets:
            return pos


class _DuplicateKeyError(ValueError):
    pass


def _reject_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """JSON silently keeps the last of repeated keys; a strict parser refuses them instead."""
    result = dict(pairs)
    if len(result) != len(pairs):
        repeated = sorted(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
        raise _DuplicateKeyError(repeated)
    return result


_JSON_OBJECTS = json.JSONDecoder(object_pairs_hook=_reject_duplicate_keys)
_JSON_VALUES = json.JSONDecoder()

# --- the Python-literal subset ---------------------------------------------------------------

_OPEN, _CLOSE, _COMMA, _SINGLE, _DOUBLE, _INT = range(1, 7)
_PY_TOKEN = re.compile(
    r"(?:[ \t\r\n\f]|\#[^\r\n]*)*+"  # whitespace and comments between tokens (implicit line joining)
    r"(?:(\[)|(\])|(,)"
    r"|'((?:[^'\\\r\n]|\\(?:\r\n|[\s\S]))*+)'"
    r'|"((?:[^"\\\r\n]|\\(?:\r\n|[\s\S]))*+)"'
    r"|(-?(?:0(?:_?0)*|[1-9](?:_?[0-9])*))(?![\w.]))"
)
_PY_ESCAPE = re.compile(
    r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|N\{([^}\r\n]*)\}|([0-7]{1,3})|(\r\n|[\s\S]))"
)
_SIMPLE_ESCAPES = {
    "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
    "t": "\t", "v": "\v", "\n": "", "\r\n": "", "\r": "",
}  # fmt: skip


class LiteralError(ValueError):
    pass


def _unescape_python(match: re.Match[str]) -> str:
    hex2, hex4, hex8, name, octal, other = match.groups()
    if hex2 or hex4 or hex8:
        code = int(hex2 or hex4 or hex8, 16)
        if code > 0x10FFFF:
            raise LiteralError("\\U escape out of range")
        return chr(code)
    if name is not None:
        try:
            return unicodedata.lookup(name)
        except KeyError:
            raise LiteralError(f"unknown character name {name!r}") from None
    if octal:
        return chr(int(octal, 8))
    if other in "xuUN":  # truncated \x, \u, \U or \N escape: a SyntaxError in Python
        raise LiteralError(f"malformed \\{other} escape")
    return _SIMPLE_ESCAPES.get(other, "\\" + other)  # unknown escapes keep the backslash, as Python does


def _python_string(body: str) -> str:
    return _PY_ESCAPE.sub(_unescape_python, body) if "\\" in body else body


def _decode_python_list(text: str, start: int) -> tuple[list, int]:
    """Decode the list literal opening at text[start] ("["); returns (value, end)."""
    stack: list[list] = []
    expecting_value = True  # after "[" or ",": a value or "]" may come; after a value: "," or "]"
    pos = start
    while True:
        match = _PY_TOKEN.match(text, pos)
        if match is None:
            raise LiteralError(f"unexpected text at offset {pos - start} of the literal")
        pos = match.end()
        kind = match.lastindex
        if kind == _OPEN:
            if not expecting_value:
                raise LiteralError("missing comma before '['")
            new: list = []
            if stack:
                stack[-1].append(new)
            stack.append(new)
            expecting_value = True
        elif kind == _CLOSE:
            if not stack:
                raise LiteralError("unbalanced ']'")
            finished = stack.pop()
            if not stack:
                return finished, pos
            expecting_value = False
        elif kind == _COMMA:
            if expecting_value:
                raise LiteralError("',' where a value belongs")
            expecting_value = True
        else:
            if not expecting_value:
                raise LiteralError("missing comma between values")
            if not stack:
                raise LiteralError("a value outside the list")
            if kind == _INT:
                try:
                    value: object = int(match.group(_INT).replace("_", ""))
                except ValueError:  # beyond the interpreter's int-string digit limit
                    raise LiteralError("integer too long") from None
            else:
                value = _python_string(match.group(kind))
            stack[-1].append(value)
            expecting_value = False


def _only_plain_values(value: object) -> bool:
    """True if a JSON-decoded value holds only lists, strings and ints (no bool/None/float)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if type(item) is list:
            pending.extend(item)
        elif type(item) is not str and type(item) is not int:
            return False
    return True


# Escapes whose JSON and Python readings differ: "\/" (Python keeps the backslash) and surrogate
# pairs (JSON joins "\ud83d\ude00" into one character, Python keeps two).
_JSON_ONLY_ESCAPE = re.compile(r"\\(?:/|u[dD][89a-fA-F])")


def _decode_list_literal(text: str, start: int) -> tuple[list, int]:
    """The three-list form's value. JSON's C decoder serves as a fast path when its result is
    certainly what the Python reading gives (no JSON-only escapes or literals)."""
    try:
        value, end = _JSON_VALUES.raw_decode(text, start)
    except (ValueError, RecursionError):
        pass
    else:
        if _only_plain_values(value) and not _JSON_ONLY_ESCAPE.search(text, start, end):
            return value, end
    return _decode_python_list(text, start)


# --- the last block --------------------------------------------------------------------------

# The last block found: ("json", value) | ("lists", {name: value}) | ("error", code, message)
Block = tuple


def last_block(text: str) -> Block | None:
    """Scan the text once, decoding each candidate; the one that starts last wins.

    For the three-list form, the last assignment of each name counts, so reasoning that mentions
    an earlier draft (`model_id = [1]`) before the final lists does not interfere.
    """
    last: Block | None = None
    assignments: dict[str, object] = {}
    hits = []
    for keyword in _KEYWORDS:
        at = text.find(keyword)
        while at >= 0:
            hits.append((at, keyword))
            at = text.find(keyword, at + len(keyword))
    hits.sort()
    pos = 0  # everything before pos belongs to a decoded block
    for at, keyword in hits:
        if at < pos:
            continue
        candidate = _candidate_at(text, at, keyword)
        if candidate is None:
            continue
        kind, start = candidate
        if kind == "json":
            assignments = {}  # a JSON block closes any three-list group before it
            try:
                value, end = _JSON_OBJECTS.raw_decode(text, start)
                last = ("json", value)
            except _DuplicateKeyError as exc:
                end = _block_end(text, start)
                last = ("error", "schema", f"repeated JSON keys {exc.args[0]}")
            except RecursionError:
                end = _block_end(text, start)
                last = ("error", "schema", "JSON nested deeper than any workflow")
            except ValueError as exc:
                end = _block_end(text, start)
                last = ("error", "json_decode", f"JSON block does not decode: {exc}")
        else:
            name = keyword
            try:
                value, end = _decode_list_literal(text, start)
                assignments[name] = value
            except LiteralError as exc:
                end = _block_end(text, start)
                assignments[name] = LiteralError(str(exc))
            last = ("lists", assignments)
        pos = max(end, at + 1)
    return last
