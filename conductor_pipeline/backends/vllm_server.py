"""Start and stop local `vllm serve` processes for a pool's `vllm` seats (GPU machines only).

The seats are then called like any other OpenAI-compatible endpoint (`openai_seat()` gives the
`openai` seat that points at the running server), so vLLM adds no client code. Nothing here
imports vllm: the launcher only builds the command line of the `vllm` executable, which is why
this module loads (and its tests run) on machines without the `gpu` extra.

Several seats can share one GPU (the reproduced phase-0 served q2/q4/q9 side by side): each
server claims `gpu_memory_utilization` of the GPU's memory, so `VllmPool` refuses fractions that
sum to 1 or more, and starts the servers one after another because vLLM profiles free memory
at start-up.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from conductor_pipeline.pools import PoolConfig, VllmSeatConfig, WorkerSeat

logger = logging.getLogger(__name__)

VLLM_EXECUTABLE: tuple[str, ...] = ("vllm",)
# Loading weights, profiling memory and capturing CUDA graphs takes minutes for a 7B model.
DEFAULT_HEALTH_TIMEOUT_S = 900.0
# Readiness of another process can only be observed by asking; once a second is plenty.
HEALTH_POLL_S = 1.0
# vLLM frees GPU memory on SIGTERM; after this long the process group gets SIGKILL.
DEFAULT_STOP_GRACE_S = 30.0
# How much of the server log an error quotes.
LOG_TAIL_CHARS = 3000


class VllmServerError(RuntimeError):
    """A vLLM server that exited early or never became healthy; the message quotes its log."""


def vllm_serve_argv(
    seat: WorkerSeat, *, host: str, port: int, executable: Sequence[str] = VLLM_EXECUTABLE
) -> list[str]:
    """The `vllm serve` command line for one seat (no shell: the model id is one argv item)."""
    config = seat.vllm or VllmSeatConfig()
    return [
        *executable, "serve", seat.model,
        "--host", host,
        "--port", str(port),
        "--served-model-name", seat.model,
        "--gpu-memory-utilization", str(config.gpu_memory_utilization),
        "--max-model-len", str(config.max_model_len),
        "--dtype", config.dtype,
        *config.extra_args,
    ]


class VllmServer:
    """One `vllm serve` subprocess: start, wait for `/health`, stop (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        seat: WorkerSeat,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        executable: Sequence[str] = VLLM_EXECUTABLE,
        health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S,
        health_poll_s: float = HEALTH_POLL_S,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.seat = seat
        self.host = host
        self.port = port if port is not None else (seat.vllm or VllmSeatConfig()).port
        self.argv = vllm_serve_argv(seat, host=host, port=self.port, executable=executable)
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
        return f"{self.root_url}/v1"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def openai_seat(self) -> WorkerSeat:
        """The same seat as an `openai` seat pointing at this server."""
        return self.seat.model_copy(update={"backend": "openai", "endpoint": self.base_url, "vllm": None})

    def start(self) -> None:
        """Launch the process in its own session, so stopping reaches vLLM's engine subprocesses too."""
        if self._process is not None:
            raise RuntimeError(f"vLLM server for {self.seat.name!r} already started")
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix=f"vllm-{self.seat.name}-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        env = dict(os.environ if self.env is None else self.env)
        logger.info("starting vLLM for seat %s on port %d (log %s)", self.seat.name, self.port, self.log_path)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                stdin=subprocess.DEVNULL,
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
                    raise VllmServerError(
                        f"vLLM for seat {self.seat.name!r} exited with code {code} before it was healthy; "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if client.get(f"{self.root_url}/health").status_code == 200:
                        logger.info("vLLM for seat %s is healthy at %s", self.seat.name, self.base_url)
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                if time.monotonic() >= deadline:
                    self.stop()
                    raise VllmServerError(
                        f"vLLM for seat {self.seat.name!r} was not healthy after {self.health_timeout_s:.0f}s; "
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
                logger.warning("vLLM for seat %s ignored SIGTERM for %.0fs; killing", self.seat.name, self.stop_grace_s)
                self._signal_group(process, signal.SIGKILL)
                process.wait()
        # Children (engine cores) may outlive the leader; the group goes down with it.
        self._signal_group(process, signal.SIGKILL)
        return process.returncode

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(process.pid, sig)  # the leader's pid is the group id (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> VllmServer:
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


class VllmPool:
    """The `vllm` seats of a pool, served side by side on one GPU."""

    def __init__(self, servers: Sequence[VllmServer]) -> None:
        if not servers:
            raise ValueError("no vllm seats to serve")
        total = sum((s.seat.vllm or VllmSeatConfig()).gpu_memory_utilization for s in servers)
        if total >= 1.0:
            shares = {s.seat.name: (s.seat.vllm or VllmSeatConfig()).gpu_memory_utilization for s in servers}
            raise ValueError(f"gpu_memory_utilization of seats sharing one GPU must sum below 1; got {total:.2f}: "
                             f"{shares}")
        ports = [s.port for s in servers]
        if len(set(ports)) != len(ports):
            raise ValueError(f"vllm seats need distinct ports; got {dict(zip((s.seat.name for s in servers), ports))}")
        self.servers = list(servers)

    @classmethod
    def from_pool(cls, pool: PoolConfig, **server_options: object) -> VllmPool:
        """Servers for every `vllm` seat of `pool` (options go to each `VllmServer`)."""
        return cls([VllmServer(seat, **server_options) for seat in pool.workers if seat.backend == "vllm"])

    def served_pool(self, pool: PoolConfig) -> PoolConfig:
        """`pool` with each served seat turned into an `openai` seat on its running server."""
        served = {s.seat.name: s.openai_seat() for s in self.servers}
        return pool.model_copy(update={"workers": [served.get(w.name, w) for w in pool.workers]})

    def __enter__(self) -> VllmPool:
        started: list[VllmServer] = []
        try:
            for server in self.servers:  # one at a time: each profiles the GPU memory left to it
                server.start()
                started.append(server)
                server.wait_healthy()
        except BaseException:
            for server in reversed(started):
                server.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for server in reversed(self.servers):
            server.stop()
