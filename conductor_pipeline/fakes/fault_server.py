"""A real OpenAI-compatible HTTP server on 127.0.0.1 that injects provider faults at set rates.

Why our own server rather than a mock: the client's fault taxonomy (429 + Retry-After, 5xx,
hangs past the timeout, connection resets, reasoning-only and truncated completions) is only
trustworthy if it is exercised over real sockets, and a real reset (TCP RST) cannot be produced
by an ASGI app. So this is a small HTTP/1.1 server on asyncio streams (uvloop when available)
that runs in its own process (its own GIL, so benchmarks measure the client, not the server).

It counts every chat-completions request it served per fault kind, its peak number of requests
in flight, and whether each carried the expected bearer key, so tests can reconcile the client's
view with the server's. Admin routes live under `/_fault/` and are never counted.

    with FaultServer(latency_s=0.05, faults=FaultRates(rate_limit=0.1)) as srv:
        worker = OpenAICompatWorker(seat_with(endpoint=srv.base_url), retry)
        ...
        assert srv.stats().served["rate_limit"] > 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import socket
import struct
import sys
import tempfile
import time
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
# The first stdout line of the server, naming the port it bound (`--port 0` picks one; FaultServer
# passes a free port and waits on /health instead, its stdout going to the log).
READY_PREFIX = "FAULT_SERVER_LISTENING"
# How often the parent asks /health while the child starts (it is up in well under a second), and
# how long a stopping child gets after SIGTERM before SIGKILL.
STARTUP_POLL_S = 0.02
STOP_GRACE_S = 5.0
# Headers plus body of one request; anything larger is not a chat call from our clients.
MAX_HEAD_BYTES = 64 * 1024


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


class _FaultApp:
    """The server state and HTTP handling (runs inside the server process)."""

    def __init__(self, config: FaultServerConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.forced: list[FaultKind] = []
        self.reset_counters()

    def reset_counters(self) -> None:
        self.total_requests = 0
        self.served = dict.fromkeys((k.value for k in FaultKind), 0)
        self.unauthorized = 0
        self.auth_ok = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.in_flight_by_model: dict[str, int] = {}
        self.peak_in_flight_by_model: dict[str, int] = {}
        self.log: list[dict] = []

    def draw(self) -> FaultKind:
        if self.forced:
            return self.forced.pop(0)
        roll = self.rng.random()
        for kind, rate in self.config.faults.model_dump().items():
            if roll < rate:
                return FaultKind(kind)
            roll -= rate
        return FaultKind.OK

    def stats(self, with_log: bool) -> dict:
        return FaultServerStats(
            total_requests=self.total_requests,
            served=self.served,
            unauthorized=self.unauthorized,
            auth_ok=self.auth_ok,
            in_flight=self.in_flight,
            peak_in_flight=self.peak_in_flight,
            peak_in_flight_by_model=self.peak_in_flight_by_model,
            log=self.log if with_log else None,
        ).model_dump()

    # --- HTTP plumbing -------------------------------------------------------------------

    async def handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                method, target, _version = request_line.split(" ", 2)
                headers = {}
                for line in header_lines:
                    if line:
                        key, _, value = line.partition(":")
                        headers[key.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                try:
                    body = await reader.readexactly(length) if length else b""
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                keep_open = await self.dispatch(method, target.split("?", 1)[0], headers, body, reader, writer)
                if not keep_open or headers.get("connection", "").lower() == "close":
                    return
        finally:
            if not writer.transport.is_closing():
                writer.close()

    @staticmethod
    async def respond(
        writer: asyncio.StreamWriter, status: int, payload: bytes, extra_headers: dict[str, str] | None = None
    ) -> bool:
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests",
                  500: "Internal Server Error"}.get(status, "Status")
        lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(payload)}"]
        lines += [f"{k}: {v}" for k, v in (extra_headers or {}).items()]
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
            await writer.drain()
        except ConnectionError:
            return False
        return True

    @staticmethod
    async def sleep_unless_disconnected(reader: asyncio.StreamReader, seconds: float) -> bool:
        """Sleep, but stop early if the client hangs up; True if the client is still there."""
        if seconds <= 0:
            return True
        eof = asyncio.ensure_future(reader.read(1))  # our clients never pipeline: data here means EOF or abuse
        try:
            done, _ = await asyncio.wait({eof}, timeout=seconds)
            return not done
        finally:
            if not eof.done():
                # Wait for the cancellation to land: until it does, the stream still has a reader
                # waiting and the next `readuntil` on this keep-alive connection would fail.
                eof.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await eof

    async def dispatch(
        self, method: str, path: str, headers: dict[str, str], body: bytes,
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
    ) -> bool:
        if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            return await self.chat_completion(headers, body, reader, writer)
        if method == "GET" and path == "/health":
            return await self.respond(writer, 200, b"{}")
        if method == "GET" and path == "/v1/models":
            payload = {"object": "list", "data": [{"id": self.config.model, "object": "model", "owned_by": "fault"}]}
            return await self.respond(writer, 200, json.dumps(payload).encode())
        if method == "GET" and path == "/_fault/stats":
            return await self.respond(writer, 200, json.dumps(self.stats(with_log=True)).encode())
        if method == "POST" and path == "/_fault/reset":
            self.reset_counters()
            self.forced.clear()
            return await self.respond(writer, 200, b"{}")
        if method == "POST" and path == "/_fault/queue":
            self.forced.extend(FaultKind(k) for k in json.loads(body)["kinds"])
            return await self.respond(writer, 200, b"{}")
        if method == "POST" and path == "/_fault/config":
            self.config = FaultServerConfig.model_validate({**self.config.model_dump(), **json.loads(body)})
            return await self.respond(writer, 200, b"{}")
        return await self.respond(writer, 404, b'{"error": {"message": "no such route"}}')

    async def chat_completion(
        self, headers: dict[str, str], body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        config = self.config
        try:
            request = json.loads(body)
        except json.JSONDecodeError:
            return await self.respond(writer, 400, b'{"error": {"message": "body is not JSON"}}')
        auth_ok = headers.get("authorization") == f"Bearer {config.expected_api_key}"
        if config.expected_api_key is not None and not auth_ok:
            self.unauthorized += 1
            return await self.respond(writer, 401, b'{"error": {"message": "invalid api key", "type": "auth"}}')
        kind = self.draw()
        self.total_requests += 1
        self.served[kind.value] += 1
        self.auth_ok += auth_ok
        self.log.append({"t": time.monotonic(), "kind": kind.value, "model": request.get("model"),
                         "max_tokens": request.get("max_tokens"), "auth": auth_ok})
        model = str(request.get("model"))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.in_flight_by_model[model] = self.in_flight_by_model.get(model, 0) + 1
        self.peak_in_flight_by_model[model] = max(
            self.peak_in_flight_by_model.get(model, 0), self.in_flight_by_model[model]
        )
        in_flight_released = False

        def release() -> None:
            # Released before the response is written, so a client that reacts at once to the
            # response can never make the server count one call twice.
            nonlocal in_flight_released
            if not in_flight_released:
                self.in_flight -= 1
                self.in_flight_by_model[model] -= 1
                in_flight_released = True

        try:
            wait = config.hang_s if kind is FaultKind.HANG else config.latency_s
            if not await self.sleep_unless_disconnected(reader, wait):
                return False
            release()
            if kind is FaultKind.RESET or kind is FaultKind.HANG:
                self.abort_with_reset(writer)
                return False
            if kind is FaultKind.RATE_LIMIT:
                retry_headers = {"Retry-After": str(math.ceil(config.retry_after_s)),
                                 "retry-after-ms": str(round(config.retry_after_s * 1000))}
                payload = b'{"error": {"message": "rate limited", "type": "rate_limit"}}'
                return await self.respond(writer, 429, payload, retry_headers)
            if kind is FaultKind.SERVER_ERROR:
                return await self.respond(writer, 500, b'{"error": {"message": "injected fault", "type": "server"}}')
            if kind is FaultKind.BAD_REQUEST:
                return await self.respond(writer, 400, b'{"error": {"message": "injected bad request"}}')
            if kind is FaultKind.MALFORMED:
                return await self.respond(writer, 200, b'{"choices": [ this is not json')
            return await self.respond(writer, 200, json.dumps(self.completion(kind, request)).encode())
        finally:
            release()

    @staticmethod
    def abort_with_reset(writer: asyncio.StreamWriter) -> None:
        """Close with a TCP RST (SO_LINGER 0), the way a crashing proxy drops a connection."""
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        writer.transport.abort()

    def completion(self, kind: FaultKind, request: dict) -> dict:
        prompt_words = sum(len(str(m.get("content") or "").split()) for m in request.get("messages", []))
        content: str | None = f"The answer is \\boxed{{{self.config.answer}}}."
        reasoning: str | None = None
        finish_reason = "stop"
        if kind is FaultKind.TRUNCATED:
            content, finish_reason = "Let me work this out step by step. First,", "length"
        elif kind is FaultKind.REASONING_ONLY:
            content, reasoning = None, "Thinking about the problem without ever writing an answer."
        completion_words = len((content or "").split()) + len((reasoning or "").split())
        message = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return {
            "id": f"chatcmpl-{self.total_requests}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", self.config.model),
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {
                "prompt_tokens": prompt_words,
                "completion_tokens": completion_words,
                "total_tokens": prompt_words + completion_words,
                "completion_tokens_details": {"reasoning_tokens": len((reasoning or "").split())},
            },
        }


async def serve(config: FaultServerConfig, host: str, port: int) -> None:
    """Run the server until SIGTERM/SIGINT; prints the ready line with the bound port."""
    app = _FaultApp(config)
    server = await asyncio.start_server(app.handle_connection, host, port, limit=MAX_HEAD_BYTES, backlog=4096)
    bound_port = server.sockets[0].getsockname()[1]
    print(f"{READY_PREFIX} {bound_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args, _unknown = parser.parse_known_args(argv)
    config = FaultServerConfig.model_validate_json(os.environ.get(CONFIG_ENV) or "{}")
    try:
        import uvloop  # the fast loop matters at C=256 on two cores

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        runner = asyncio.run
    runner(serve(config, args.host, args.port))


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
            [sys.executable, "-m", "conductor_pipeline.fakes.fault_server", "--host", self.host, "--port", str(port)],
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


if __name__ == "__main__":
    main()
