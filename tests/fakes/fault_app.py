"""The fault server's process: an HTTP/1.1 server on asyncio streams that answers OpenAI-style chat
and completion requests with the faults its configuration draws, and counts what it served.

Run by `FaultServer` (`tests.fakes.fault_server`) as `python -m
tests.fakes.fault_app`, its settings in the environment variable `CONFIG_ENV`.
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
import time
from collections.abc import Sequence

from tests.fakes.fault_server import CONFIG_ENV, FaultKind, FaultServerConfig, FaultServerStats

# The first stdout line of the server, naming the port it bound (`--port 0` picks one; FaultServer
# passes a free port and waits on /health instead, its stdout going to the log).
READY_PREFIX = "FAULT_SERVER_LISTENING"
# Headers plus body of one request; anything larger is not a chat call from our clients.
MAX_HEAD_BYTES = 64 * 1024


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


if __name__ == "__main__":
    main()
