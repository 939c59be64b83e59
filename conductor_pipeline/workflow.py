"""The conductor's workflow: a strict parser with named failure codes, and its renderer.

A workflow is up to `max_steps` steps run in order; each names a worker, gives it a subtask, and
says which earlier steps' outputs it may read. The parser accepts the Conductor paper's three
lists (``model_id = [...]``, ``subtasks = [...]``, ``access_list = [...]``) and a JSON form
(``{"steps": [{"worker", "subtask", "sees"}]}`` or an object with the three list keys), anywhere
in the text, fenced or bare; free reasoning may come first and the LAST block counts.

Why strict: under RL the policy must feel every formatting error, so nothing is repaired (no
trailing-comma or quote fixing in JSON, no fuzzy worker names), and every failure carries one of
`PARSE_CODES`, which are first-class metrics in eval tables and training steps.

How the text is read, and why it is safe on untrusted model output:
- Nothing is evaluated. JSON goes through `json` (C decoder); the three-list form is read by a
  small iterative decoder for a *subset* of Python literals: lists, integers and single-line
  quoted strings (single or double quotes, Python escapes, no prefixes, no triple quotes, no
  implicit concatenation), with comments and trailing commas as Python allows them. Trailing
  commas are legal Python, so accepting them there is not a repair; in JSON they are an error.
  Only the literal after `model_id =` is read: the text after it (a comment, prose, or even an
  operator) is not part of the block. `ast.literal_eval` is avoided: it builds a full AST (slow,
  recursion-bound on deep input) and accepts far more than a workflow needs.
- Work is (near) linear in the text: candidate blocks are found with `str.find` of the workflow
  keywords and checked in place, each block is decoded once (JSON's C decoder first, where its
  reading provably equals Python's), and the scan resumes after it. A literal that never closes swallows the rest of the text
  (it is the last block, and fails to decode). The Python-literal decoder keeps an explicit stack,
  so nesting depth cannot exhaust the interpreter's recursion limit.

How a block is found and decoded: `conductor_pipeline.workflow_blocks`.

What a step sees is a set: `[1, 0, 0]` reads as `(0, 1)`; "all" and ["all"] read as every
earlier step (nothing, for step 0).
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from conductor_pipeline.workflow_blocks import Block, LiteralError, last_block

# --- failure codes -----------------------------------------------------------------------------

PARSE_OK = "ok"
PARSE_CODES: tuple[str, ...] = (
    "no_workflow",  # no workflow block anywhere in the text
    "json_decode",  # a block that does not decode (JSON, or the Python-literal subset)
    "schema",  # decodes, but wrong shape or types (missing/extra keys, non-string subtask, ...)
    "length_mismatch",  # the three lists differ in length
    "empty",  # zero steps (allowed only with allow_empty=True, the recursion pass-through)
    "too_many_steps",  # more than max_steps steps
    "unknown_worker",  # a name not in the pool, or an index out of range
    "forward_dep",  # a step sees itself or a later step
    "empty_subtask",  # a subtask that is empty or only whitespace
)

DEFAULT_MAX_STEPS = 5  # the paper's cap on workflow length
LIST_KEYS: tuple[str, str, str] = ("model_id", "subtasks", "access_list")
STEP_KEYS = frozenset({"worker", "subtask", "sees"})
ALL = "all"  # access entry meaning "every earlier step"


class WorkflowParseError(ValueError):
    """A workflow that cannot be used; `.code` is one of `PARSE_CODES`."""

    def __init__(self, code: str, message: str) -> None:
        if code not in PARSE_CODES:
            raise ValueError(f"unknown parse code {code!r}")
        # Both in args, so the error pickles across processes (Dagster's multiprocess executor).
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


# --- the parsed workflow ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """One step: `worker` (a pool name), its `subtask`, and the 0-based earlier steps it `sees`."""

    worker: str
    subtask: str
    sees: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Workflow:
    """Steps run in order; the last step's answer is the workflow's answer.

    Zero steps only come from `parse_workflow(..., allow_empty=True)`: the recursion pass-through.
    """

    steps: tuple[Step, ...]

    @property
    def workers(self) -> tuple[str, ...]:
        """The worker of each step, in order (repeats kept)."""
        return tuple(step.worker for step in self.steps)


# --- validation ------------------------------------------------------------------------------


def _fail(code: str, message: str) -> WorkflowParseError:
    return WorkflowParseError(code, message)


def _lists_from_block(block: Block) -> tuple[list, list, list]:
    kind = block[0]
    if kind == "error":
        raise _fail(block[1], block[2])
    if kind == "lists":
        assignments = block[1]
        for name in LIST_KEYS:
            value = assignments.get(name)
            if isinstance(value, LiteralError):
                raise _fail("json_decode", f"`{name}` does not decode: {value}")
        missing = [name for name in LIST_KEYS if name not in assignments]
        if missing:
            raise _fail("schema", f"missing list(s) {missing}; need model_id, subtasks and access_list")
        return assignments["model_id"], assignments["subtasks"], assignments["access_list"]
    value = block[1]
    if not isinstance(value, dict):  # pragma: no cover - the candidate regex only matches objects
        raise _fail("schema", "a workflow block must be a JSON object")
    if "steps" in value:
        if len(value) != 1:
            raise _fail("schema", f"a steps object has only the key 'steps'; got {sorted(value)}")
        steps = value["steps"]
        if type(steps) is not list:
            raise _fail("schema", "'steps' must be a list")
        workers, subtasks, access = [], [], []
        for index, step in enumerate(steps):
            if type(step) is not dict or step.keys() != STEP_KEYS:
                got = sorted(step) if type(step) is dict else type(step).__name__
                raise _fail("schema", f"step {index} must be an object with keys worker, subtask, sees; got {got}")
            workers.append(step["worker"])
            subtasks.append(step["subtask"])
            access.append(step["sees"])
        return workers, subtasks, access
    if value.keys() != set(LIST_KEYS):
        raise _fail("schema", f"a list object has exactly the keys {list(LIST_KEYS)}; got {sorted(value)}")
    return value["model_id"], value["subtasks"], value["access_list"]


def _check_types(workers: object, subtasks: object, access: object) -> None:
    for name, value in zip(LIST_KEYS, (workers, subtasks, access), strict=True):
        if type(value) is not list:
            raise _fail("schema", f"`{name}` must be a list, got {type(value).__name__}")
    for index, worker in enumerate(workers):  # type: ignore[arg-type]
        if type(worker) is not str and type(worker) is not int:
            raise _fail("schema", f"worker of step {index} must be a name or an index, got {type(worker).__name__}")
    for index, subtask in enumerate(subtasks):  # type: ignore[arg-type]
        if type(subtask) is not str:
            raise _fail("schema", f"subtask of step {index} must be a string, got {type(subtask).__name__}")
    for index, entry in enumerate(access):  # type: ignore[arg-type]
        if entry == ALL or entry == [ALL]:
            continue
        if type(entry) is not list or not all(type(i) is int and i >= 0 for i in entry):
            expected = '"all", ["all"] or a list of step indices'
            raise _fail("schema", f"access entry of step {index} must be {expected}; got {reprlib.repr(entry)}")


def _resolve_worker(worker: str | int, workers: Sequence[str], index: int) -> str:
    if type(worker) is int:
        if 0 <= worker < len(workers):
            return workers[worker]
        raise _fail("unknown_worker", f"step {index}: worker index {worker} outside 0..{len(workers) - 1}")
    if worker in workers:
        return worker  # type: ignore[return-value]
    raise _fail("unknown_worker", f"step {index}: no worker named {worker!r}")


def parse_workflow(
    text: str,
    workers: Sequence[str],
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    allow_empty: bool = False,
) -> Workflow:
    """Parse the last workflow block in `text`; raise `WorkflowParseError` with a code otherwise.

    `workers` are the names the conductor was shown (exact, case-sensitive); an integer is an index
    into them. `allow_empty` accepts zero steps: the recursion prompt's "pass the answer through".
    Codes are checked in the order of `PARSE_CODES`, so a workflow with several faults reports the
    first (e.g. a length mismatch before an unknown worker).
    """
    block = last_block(text)
    if block is None:
        raise _fail("no_workflow", "no model_id/subtasks/access_list lists and no JSON workflow object")
    raw_workers, raw_subtasks, raw_access = _lists_from_block(block)
    _check_types(raw_workers, raw_subtasks, raw_access)
    lengths = (len(raw_workers), len(raw_subtasks), len(raw_access))
    if len(set(lengths)) != 1:
        raise _fail("length_mismatch", f"model_id, subtasks, access_list have lengths {lengths}")
    n_steps = lengths[0]
    if n_steps == 0 and not allow_empty:
        raise _fail("empty", "the workflow has no steps")
    if n_steps > max_steps:
        raise _fail("too_many_steps", f"{n_steps} steps; at most {max_steps}")
    names = [_resolve_worker(worker, workers, index) for index, worker in enumerate(raw_workers)]
    for index, subtask in enumerate(raw_subtasks):
        if not subtask.strip():
            raise _fail("empty_subtask", f"step {index} has an empty subtask")
    steps = []
    for index, entry in enumerate(raw_access):
        if entry == ALL or entry == [ALL]:
            sees = tuple(range(index))
        else:
            late = [i for i in entry if i >= index]
            if late:
                raise _fail("forward_dep", f"step {index} sees step(s) {late}; only earlier steps may be seen")
            sees = tuple(sorted(set(entry)))  # canonical order: what a step sees is a set
        steps.append(Step(names[index], raw_subtasks[index], sees))
    return Workflow(tuple(steps))


def parse_code(
    text: str, workers: Sequence[str], *, max_steps: int = DEFAULT_MAX_STEPS, allow_empty: bool = False
) -> str:
    """`"ok"` or the failure code: what the reward and the eval tables record."""
    try:
        parse_workflow(text, workers, max_steps=max_steps, allow_empty=allow_empty)
    except WorkflowParseError as exc:
        return exc.code
    return PARSE_OK


# --- rendering -------------------------------------------------------------------------------


def _sees_value(step_index: int, sees: tuple[int, ...]) -> str | list[int]:
    """The paper writes "all" or []; other subsets are written as index lists."""
    if step_index > 0 and sees == tuple(range(step_index)):
        return ALL
    return list(sees)


def render_workflow(
    workflow: Workflow,
    workers: Sequence[str],
    *,
    form: Literal["lists", "json"] = "lists",
    by_index: bool = False,
) -> str:
    """The text a conductor should write for `workflow`: prompt examples and SFT targets use it.

    `workers` are the displayed names; `by_index` writes each worker as its index (the paper's
    `model_id = [0, 2]`). Output round-trips: `parse_workflow(render_workflow(w, ws), ws) == w`.
    """
    ids: list[str | int] = []
    for step in workflow.steps:
        if step.worker not in workers:
            raise ValueError(f"worker {step.worker!r} is not among the displayed workers {list(workers)}")
        ids.append(list(workers).index(step.worker) if by_index else step.worker)
    access = [_sees_value(i, step.sees) for i, step in enumerate(workflow.steps)]
    subtasks = [step.subtask for step in workflow.steps]
    if form == "json":
        steps = [
            {"worker": worker, "subtask": subtask, "sees": sees}
            for worker, subtask, sees in zip(ids, subtasks, access, strict=True)
        ]
        return json.dumps({"steps": steps}, ensure_ascii=False, indent=2)
    if form != "lists":
        raise ValueError(f"form must be 'lists' or 'json', got {form!r}")
    # JSON text of lists, ints and strings is also a Python literal with the same value.
    return "\n".join(
        f"{name} = {json.dumps(value, ensure_ascii=False)}"
        for name, value in zip(LIST_KEYS, (ids, subtasks, access), strict=True)
    )
