"""A real OpenAI-compatible HTTP server on 127.0.0.1 that injects provider faults at set rates.

Why our own server rather than a mock: the client's fault taxonomy (429 + Retry-After, 5xx,
hangs past the timeout, connection resets, reasoning-only and truncated completions) is only
trustworthy if it is exercised over real sockets, and a real reset (TCP RST) cannot be produced
by an ASGI app. So this is a small HTTP/1.1 server on asyncio streams (uvloop when available)
that runs in its own process (its own GIL, so benchmarks measure the client, not the server).

The server itself (its HTTP handling, counters and entry point) is `tests.fakes.fault_app`,
run in the child process; this module holds its settings and `FaultServer`, which starts and drives it.
It counts every chat-completions request it served per fault kind, its peak number of requests
in flight, and whether each carried the expected bearer key, so tests can reconcile the client's
view with the server's. Admin routes live under `/_fault/` and are never counted.

    with FaultServer(latency_s=0.05, faults=FaultRates(rate_limit=0.1)) as srv:
        worker = OpenAICompatWorker(seat_with(endpoint=srv.base_url), retry)
        ...
        assert srv.stats().served["rate_limit"] > 0
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from types import TracebackType

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from conductor_pipeline.paths import PROJECT_ROOT
from conductor_pipeline.pools.backends.local_server import LocalServerProcess, free_port

# The child process reads its configuration from this variable (JSON), so an expected API key
# never appears on a command line that `ps` would show.
CONFIG_ENV = "CORYPHAEUS_FAULT_SERVER_CONFIG"
# How often the parent asks /health while the child starts (it is up in well under a second), and
# how long a stopping child gets after SIGTERM before SIGKILL.
STARTUP_POLL_S = 0.02
STOP_GRACE_S = 5.0


class FaultKind(StrEnum):
    """What the server does with one chat-completions request."""

    OK = "ok"  # 200, the deterministic answer, finish_reason stop
    RATE_LIMIT = "rate_limit"  # 429 with Retry-After and retry-after-ms
    SERVER_ERROR = "server_error"  # 500
    HANG = "hang"  # no response for `hang_s` (past any sane client timeout)
    RESET = "reset"  # TCP reset (SO_LINGER 0 + abort) before any response byte
    REASONING_ONLY = "reasoning_only"  # 200, content null, only reasoning_content
    TRUNCATED = "truncated"  # 200, partial content, finish_reason length
    BAD_REQUEST = "bad_request"  # 400: a terminal fault
    MALFORMED = "malformed"  # 200 whose body is not JSON


class FaultRates(BaseModel):
    """Probability of each fault per request; whatever is left over is answered normally."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate_limit: float = Field(0.0, ge=0, le=1)
    server_error: float = Field(0.0, ge=0, le=1)
    hang: float = Field(0.0, ge=0, le=1)
    reset: float = Field(0.0, ge=0, le=1)
    reasoning_only: float = Field(0.0, ge=0, le=1)
    truncated: float = Field(0.0, ge=0, le=1)
    bad_request: float = Field(0.0, ge=0, le=1)
    malformed: float = Field(0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _at_most_one(self) -> FaultRates:
        if self.total > 1 + 1e-9:
            raise ValueError(f"fault rates sum to {self.total:.3f} > 1")
        return self

    @property
    def total(self) -> float:
        return sum(self.model_dump().values())

    @classmethod
    def spread(cls, total: float, kinds: Sequence[FaultKind | str]) -> FaultRates:
        """`total` fault probability split evenly over `kinds` (e.g. 20% over six kinds)."""
        share = total / len(kinds)
        return cls(**{FaultKind(k).value: share for k in kinds})


class FaultServerConfig(BaseModel):
    """Everything the server process needs; sent to it as JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_s: float = Field(0.0, ge=0, description="Fixed delay before every response (the L of benchmarks)")
    faults: FaultRates = FaultRates()
    retry_after_s: float = Field(0.2, ge=0, description="What a 429 asks the client to wait")
    hang_s: float = Field(30.0, ge=0, description="How long a hang lasts unless the client gives up first")
    answer: str = Field("42", description="The answer every ok completion boxes")
    seed: int = 0
    expected_api_key: str | None = Field(None, description="If set, requests without this bearer key get 401")
    model: str = Field("fault-server", description="The id /v1/models lists")


class FaultServerStats(BaseModel):
    """The server's own account of what it served."""

    total_requests: int
    served: dict[str, int]  # FaultKind value -> requests answered that way
    unauthorized: int  # requests rejected with 401 (not counted in `served`)
    auth_ok: int  # requests that carried the expected bearer key
    in_flight: int
    peak_in_flight: int
    peak_in_flight_by_model: dict[str, int]  # the request's `model`: one seat per model in tests
    log: list[dict] | None = None  # per request: t (monotonic), kind, model, max_tokens, auth


class FaultServer:
    """Starts the fault server in a child process for the duration of a `with` block."""

    def __init__(
        self,
        latency_s: float = 0.0,
        faults: FaultRates | None = None,
        *,
        retry_after_s: float = 0.2,
        hang_s: float = 30.0,
        answer: str = "42",
        seed: int = 0,
        expected_api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout_s: float = 20.0,
    ) -> None:
        self.config = FaultServerConfig(
            latency_s=latency_s, faults=faults or FaultRates(), retry_after_s=retry_after_s, hang_s=hang_s,
            answer=answer, seed=seed, expected_api_key=expected_api_key,
        )
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self._server: LocalServerProcess | None = None
        self._admin: httpx.Client | None = None

    @property
    def pid(self) -> int | None:
        """The server process id (benchmarks read its CPU time to tell client cost from server cost)."""
        return self._server.pid if self._server is not None else None

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (`…/v1`) to put in a seat's `endpoint`."""
        return f"{self.root_url}/v1"

    def __enter__(self) -> FaultServer:
        env = {**os.environ, CONFIG_ENV: self.config.model_dump_json()}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
        port = self.port or free_port(self.host)
        self._logs = tempfile.TemporaryDirectory(prefix="fault-server-")
        # The project's one way to run a server process: its own session, a log file, /health, a sure stop.
        self._server = LocalServerProcess(
            [sys.executable, "-m", "tests.fakes.fault_app", "--host", self.host, "--port", str(port)],
            name="fault-server", host=self.host, port=port, health_timeout_s=self.startup_timeout_s,
            health_poll_s=STARTUP_POLL_S, stop_grace_s=STOP_GRACE_S, log_path=Path(self._logs.name) / "server.log",
            env=env,
        )
        try:
            self._server.__enter__()
        except BaseException:
            self._logs.cleanup()
            self._server = None
            raise
        self.port = port
        self._admin = httpx.Client(base_url=self.root_url, timeout=10.0)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._server is not None:
            self._server.stop()
            self._server = None
            self._logs.cleanup()

    def _post(self, path: str, payload: dict) -> None:
        assert self._admin is not None, "use FaultServer as a context manager"
        self._admin.post(path, json=payload).raise_for_status()

    def stats(self) -> FaultServerStats:
        """The server's counters (and per-request log) right now."""
        assert self._admin is not None, "use FaultServer as a context manager"
        response = self._admin.get("/_fault/stats")
        response.raise_for_status()
        return FaultServerStats.model_validate(response.json())

    def queue(self, *kinds: FaultKind | str) -> None:
        """Serve exactly these kinds to the next requests, in order, before drawing at random again."""
        self._post("/_fault/queue", {"kinds": [FaultKind(k).value for k in kinds]})

    def reset(self) -> None:
        """Zero the counters and drop any queued faults."""
        self._post("/_fault/reset", {})

    def configure(self, **changes: object) -> None:
        """Change latency, fault rates or other settings of the running server."""
        if isinstance(changes.get("faults"), FaultRates):
            changes["faults"] = changes["faults"].model_dump()
        self._post("/_fault/config", changes)
