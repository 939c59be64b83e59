"""A local model server as a subprocess: start it, wait for `/health`, stop it for sure.

`vllm serve` and `transformers serve` are both long-starting OpenAI-compatible servers whose
readiness is announced only by `/health`; both spawn helpers (engine cores, loader threads)
that must not outlive a run. This is the one place that knows how to handle such a process:
it runs in its own session so the whole group can be signalled, logs go to a file (a pipe
left unread would block the server), and stop is SIGTERM then SIGKILL after a grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

logger = logging.getLogger(__name__)

# Readiness of another process can only be observed by asking; once a second is plenty for
# servers that take tens of seconds to minutes to load.
HEALTH_POLL_S = 1.0
# Servers free accelerator memory on SIGTERM; after this long the process group gets SIGKILL.
DEFAULT_STOP_GRACE_S = 30.0
# How much of the server log an error quotes.
LOG_TAIL_CHARS = 3000


class LocalServerError(RuntimeError):
    """A server that exited early or never became healthy; the message quotes its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now on `host` (another process could still take it before the server binds)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LocalServerProcess:
    """One server subprocess with an OpenAI-compatible API under `/v1` and a `/health` route."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        host: str,
        port: int,
        health_timeout_s: float,
        health_poll_s: float = HEALTH_POLL_S,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.name = name
        self.host = host
        self.port = port
        self.health_timeout_s = health_timeout_s
        self.health_poll_s = health_poll_s
        self.stop_grace_s = stop_grace_s
        self.log_path = log_path
        self.env = env
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL to put in a seat's `endpoint`."""
        return f"{self.root_url}/v1"

    @property
    def pid(self) -> int | None:
        """The server process id while it runs (started and not yet stopped)."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Launch the process in its own session, so stopping reaches its helper processes too."""
        if self._process is not None:
            raise RuntimeError(f"server {self.name!r} already started")
        if self.log_path is None:
            handle, path = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
            os.close(handle)
            self.log_path = Path(path)
        env = dict(os.environ if self.env is None else self.env)
        logger.info("starting %s on %s (log %s)", self.name, self.root_url, self.log_path)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )

    def log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]

    def wait_healthy(self) -> None:
        """Block until `/health` answers 200; stop the server and raise if it dies or times out."""
        assert self._process is not None, "start() first"
        deadline = time.monotonic() + self.health_timeout_s
        with httpx.Client(timeout=max(1.0, self.health_poll_s * 5)) as client:
            while True:
                code = self._process.poll()
                if code is not None:
                    self._process = None
                    raise LocalServerError(
                        f"{self.name} exited with code {code} before it was healthy; "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if client.get(f"{self.root_url}/health").status_code == 200:
                        logger.info("%s is healthy at %s", self.name, self.base_url)
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                if time.monotonic() >= deadline:
                    self.stop()
                    raise LocalServerError(
                        f"{self.name} was not healthy after {self.health_timeout_s:.0f}s; "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(self.health_poll_s)

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL it after the grace period; returns the exit code."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            self._signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s ignored SIGTERM for %.0fs; killing its process group", self.name, self.stop_grace_s)
                self._signal_group(process, signal.SIGKILL)
                process.wait()
        # Helpers may outlive the leader; the group goes down with it.
        self._signal_group(process, signal.SIGKILL)
        return process.returncode

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(process.pid, sig)  # the leader's pid is the group id (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> LocalServerProcess:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
