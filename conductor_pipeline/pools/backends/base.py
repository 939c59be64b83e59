"""The one interface every worker backend implements."""

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
