"""Start and stop local `vllm serve` processes for a pool's `vllm` seats (GPU machines only).

The seats are then called like any other OpenAI-compatible endpoint (`openai_seat()` gives the
`openai` seat that points at the running server), so vLLM adds no client code. Nothing here
imports vllm: the launcher only builds the command line of the `vllm` executable, which is why
this module loads (and its tests run) on machines without the `gpu` extra.

Several seats can share one GPU: each server claims `gpu_memory_utilization` of the GPU's
memory, so `VllmPool` refuses fractions that sum to 1 or more, and starts the servers one after
another because vLLM profiles free memory at start-up.

A `vllm` seat that names an `endpoint` is a server someone already runs: it is called there and
never launched. Before launching, `require_vllm` checks that this machine can serve at all (the
executable, a CUDA device), so a CPU box fails at once with what is missing instead of after a
server's start-up timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from conductor_pipeline.pools.backends.local_server import (
    DEFAULT_STOP_GRACE_S,
    HEALTH_POLL_S,
    LocalServerError,
    LocalServerProcess,
)
from conductor_pipeline.pools.config import Backend, PoolConfig, VllmSeatConfig, WorkerSeat

VLLM_EXECUTABLE: tuple[str, ...] = ("vllm",)
# Loading weights, profiling memory and capturing CUDA graphs takes minutes for a 7B model.
DEFAULT_HEALTH_TIMEOUT_S = 900.0


VllmServerError = LocalServerError  # what callers catch when a launch fails
# What a machine that lacks vLLM or a GPU is told to do.
GPU_EXTRA_HINT = (
    "on a machine with an NVIDIA GPU run `pip install -e '.[gpu]'` (or point the vllm resource's `executable` at a "
    "vLLM install), or give each seat the `endpoint` of a vLLM server already running elsewhere"
)


class VllmUnavailableError(RuntimeError):
    """This machine cannot serve a pool's `vllm` seats; the message names what is missing and how to get it."""


def seats_to_launch(pool: PoolConfig, names: Collection[str] | None = None) -> list[WorkerSeat]:
    """The `vllm` seats (of `names`, or of the whole pool) without an `endpoint`: the ones to start here."""
    seats = pool.workers if names is None else [pool.seat(name) for name in names]
    return [seat for seat in seats if seat.is_vllm and not seat.endpoint]


def cuda_device_visible() -> bool:
    """Whether an NVIDIA device is visible to this process (without importing torch or vllm)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def missing_prerequisites(executable: Sequence[str], *, require_gpu: bool = True) -> list[str]:
    """What this machine lacks to run `vllm serve`: the executable, a CUDA device; empty when ready."""
    missing = []
    if shutil.which(executable[0]) is None:
        missing.append(f"the vLLM executable {executable[0]!r} is not found (not on PATH, or not executable)")
    if require_gpu and not cuda_device_visible():
        missing.append("no CUDA device is visible (no /dev/nvidia*, no working nvidia-smi, or CUDA_VISIBLE_DEVICES empty)")
    return missing


def require_vllm(
    pool: PoolConfig, seats: Sequence[WorkerSeat], executable: Sequence[str], *, require_gpu: bool = True
) -> None:
    """Raise `VllmUnavailableError` naming what is missing when this machine cannot serve `seats`."""
    missing = missing_prerequisites(executable, require_gpu=require_gpu)
    if missing:
        raise VllmUnavailableError(
            f"pool {pool.name!r}: the vllm seats {[s.name for s in seats]} are served by `vllm serve` on this "
            f"machine, which cannot run it: {'; '.join(missing)}. To serve them, {GPU_EXTRA_HINT}."
        )


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


class VllmServer(LocalServerProcess):
    """One `vllm serve` subprocess for one seat: start, wait for `/health`, stop."""

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
        port = port if port is not None else (seat.vllm or VllmSeatConfig()).port
        super().__init__(
            vllm_serve_argv(seat, host=host, port=port, executable=executable), name=f"vllm-{seat.name}",
            host=host, port=port, health_timeout_s=health_timeout_s, health_poll_s=health_poll_s,
            stop_grace_s=stop_grace_s, log_path=log_path, env=env,
        )
        self.seat = seat

    def openai_seat(self) -> WorkerSeat:
        """The same seat as an `openai` seat pointing at this server."""
        return self.seat.model_copy(update={"backend": Backend.OPENAI, "endpoint": self.base_url, "vllm": None})


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
        """Servers for every `vllm` seat of `pool` without an endpoint (options go to each `VllmServer`)."""
        return cls([VllmServer(seat, **server_options) for seat in seats_to_launch(pool)])

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
