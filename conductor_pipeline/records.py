"""The typed records that flow between the library's stages and into the warehouse.

Field names match the warehouse columns in sql/schema.sql one to one, so a record
becomes a row with `dataclasses.asdict` and nothing is renamed on the way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from conductor_pipeline.grader_version import grader_of


@dataclass(frozen=True, slots=True)
class Question:
    """One benchmark problem with its gold answer.

    `question_id` is the MATH `unique_id` (e.g. `test/algebra/1143.json`) or
    `gsm8k:<split>:<line>`; it is the join key of every table.
    """

    question_id: str
    corpus: str  # "math" or "gsm8k"
    split: str  # the source's own split: "train" or "test"
    problem: str
    answer: str
    subject: str | None = None
    level: int | None = None
    in_math500: bool = False


class CallStatus(StrEnum):
    """Every model call gets exactly one of these; only ok, truncated, empty and terminal are scored."""

    OK = "ok"
    TRUNCATED = "truncated"  # finish_reason == "length": the answer may be cut mid-thought
    EMPTY = "empty"  # no content, e.g. only reasoning tokens came back
    TRANSIENT = "transient"  # 429, 5xx, timeout, connection reset; retried, never scored
    TERMINAL = "terminal"  # other 4xx: scored as that worker's failure
    NOT_RECORDED = "not_recorded"  # replay has no record for the question: not scored

    @property
    def scored(self) -> bool:
        """Whether a call with this status counts toward a worker's accuracy."""
        return self not in (CallStatus.TRANSIENT, CallStatus.NOT_RECORDED)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True, slots=True)
class CallRequest:
    """What a worker is asked: the chat turns plus the question it is about.

    `question` travels with every request because replay workers answer by question id,
    whatever the subtask text says. `visible_responses` are the responses of the earlier steps
    the request's access list lets it see, in step order (None where a step gave no text): the
    same results `messages` shows as chat turns, kept apart so a seat that aggregates them (the
    vote) reads them without parsing chat text.
    """

    question: Question
    messages: tuple[ChatMessage, ...]
    sample: int = 0
    temperature: float = 0.0
    max_tokens: int | None = None  # None: the seat's own floor applies
    visible_responses: tuple[str | None, ...] = ()


@dataclass(slots=True)
class CallResult:
    """What came back from one call, after retries, before grading."""

    status: CallStatus
    response: str | None = None
    error: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    tokens_estimated: bool = False  # replay: counts come from the text, not from a usage block
    cost_usd: float | None = None
    latency_s: float | None = None
    attempts: int = 1
    started_at: datetime | None = None
    # Replay sources that hold only a verdict (no text) carry it here; graders use it as is.
    recorded_correct: bool | None = None


@dataclass(slots=True)
class CallRecord:
    """One row of the `calls` table."""

    call_id: str
    run_id: str
    kind: str  # "probe" | "step" | "conductor"
    question_id: str
    worker: str
    sample: int
    subtask: str | None
    response: str | None
    extracted_answer: str | None
    correct: bool | None  # None when the status is not scored
    status: str
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    latency_s: float | None
    started_at: datetime | None
    pool: str | None = None
    workflow_id: str | None = None
    step: int | None = None
    reasoning_tokens: int | None = None
    tokens_estimated: bool = False
    finish_reason: str | None = None
    attempts: int = 1
    # Results of earlier workflow steps the call's context held (0 for probes and single steps).
    visible_steps: int = 0
    # The grader whose rules gave `correct`: stamped with the current one whenever there is a verdict.
    grader_version: str | None = None

    def __post_init__(self) -> None:
        self.grader_version = grader_of(self.correct, self.grader_version)


@dataclass(slots=True)
class WorkflowRecord:
    """One row of the `workflows` table: a conductor's output and what executing it gave."""

    workflow_id: str
    run_id: str
    question_id: str
    conductor: str
    raw_text: str | None
    parse_code: str  # "ok" or a WorkflowParseError code
    n_steps: int
    workers: list[str] = field(default_factory=list)
    final_answer: str | None = None
    correct: bool | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    arm: str | None = None
    repeat: int = 0
    infra_failure: bool = False
    # Training rollouts only (None on evaluation workflows): see `RolloutTag`.
    phase: str | None = None
    training_step: int | None = None
    rollout: int | None = None
    # Recursion (None / 0 on top-level workflows): the workflow and step that called the conductor
    # seat which wrote this one, how many levels below the top it ran, and the top-level workflow.
    parent_workflow_id: str | None = None
    parent_step: int | None = None
    depth: int = 0
    root_workflow_id: str | None = None
    # The workers the conductor's prompt listed, in order (None when no conductor wrote the workflow).
    catalogue: list[str] | None = None

    # As on `CallRecord`: the grader whose rules gave `correct`.
    grader_version: str | None = None

    def __post_init__(self) -> None:
        self.grader_version = grader_of(self.correct, self.grader_version)


@dataclass(frozen=True, slots=True)
class RolloutTag:
    """Where a training rollout's `workflows` row belongs: the phase of the run that sampled it, the
    optimizer step whose generation batch it was in (None outside GRPO steps) and its position there."""

    phase: str
    training_step: int | None
    rollout: int


def stable_id(*parts: object) -> str:
    """A short deterministic key from its parts, so a rerun writes the same keys again."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return digest[:24]
