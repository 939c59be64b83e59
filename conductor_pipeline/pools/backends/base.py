"""The interface every worker backend implements, and the one replay-like backends add to it."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from conductor_pipeline.records import CallRequest, CallResult


@runtime_checkable
class Worker(Protocol):
    """A pool seat that answers chat requests.

    `call` never raises for provider faults: it classifies them into `CallResult.status`
    (retrying transient ones inside its own budget), so callers can account for every call.
    """

    name: str

    async def call(self, request: CallRequest) -> CallResult: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class RecordedWorker(Worker, Protocol):
    """A Worker that answers from a fixed set of recordings rather than sampling anew (replay).

    Callers ask it what it holds before calling: a probe skips what it never recorded, an
    evaluation restricts its slice to what every seat recorded, and a repeat replays one of its
    recorded samples instead of asking past them (which would only return `not_recorded`).
    """

    @property
    def samples_recorded(self) -> int:
        """How many distinct samples per question it holds."""
        ...

    @property
    def question_ids(self) -> frozenset[str]:
        """The questions it has recordings for."""
        ...

    def covers(self, question_id: str, sample: int = 0) -> bool:
        """Whether a call for this question and sample index replays a recording."""
        ...
