"""Worker pool definitions: YAML files under data/pools/, validated with pydantic.

A pool names its seats; each seat says which backend answers, at what price, with which
token floor and concurrency, and carries the one-line description the conductor sees.
API keys never live here: a seat names the environment variable that holds its key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from conductor_pipeline.files import parse_yaml
from conductor_pipeline.paths import POOLS_DIR


class Backend(StrEnum):
    """Who answers a seat's calls: the `backend` value a pool file names.

    `pools.backends.registry.WORKER_BUILDERS` maps each one to the function that builds its Worker.
    """

    OPENAI = "openai"  # any OpenAI-compatible /v1 endpoint (hosted, or a server started elsewhere)
    VLLM = "vllm"  # a local `vllm serve` started by the vLLM launcher, then called as an `openai` seat
    REPLAY = "replay"  # recorded answers of a real model (zero cost, deterministic)
    CONDUCTOR = "conductor"  # the conductor itself (recursion): answered by the conductor policy, never a Worker
    VOTE = "vote"  # majority of the answers in the steps it sees (no model call, zero cost)


class PoolConfigError(ValueError):
    """A pool file that cannot be used; the message names the file and the field."""


class MissingApiKeyError(RuntimeError):
    """A seat's API-key variable is unset; raised before the first call, naming the worker."""


class VllmSeatConfig(BaseModel):
    """How the vLLM launcher serves one local seat (GPU machines only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    port: int = Field(8100, description="127.0.0.1 port of this seat's server")
    gpu_memory_utilization: float = Field(
        0.25, gt=0, le=1, description="Share of GPU memory; seats sharing one GPU must sum below 1"
    )
    max_model_len: int = Field(8192, description="Context length the server allocates KV cache for")
    dtype: str = "bfloat16"
    extra_args: list[str] = Field(default_factory=list, description="Passed verbatim to `vllm serve`")


# Seat fields that configure a model call (an endpoint, a key, a recording, a price).
_MODEL_CALL_FIELDS = (
    "endpoint", "api_key_env", "replay_source", "vllm", "price_input_per_mtok", "price_output_per_mtok",
)


class WorkerSeat(BaseModel):
    """One worker in a pool."""

    # `backend` is kept as the plain string the pool file holds (a `Backend` value), so a dumped
    # seat is again a valid pool-file entry (YAML cannot represent the enum member).
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:+-]*$", description="Unique within the pool")
    backend: Backend
    model: str = Field(description="Served model id; for replay, the recorded model's name")
    description: str = Field(min_length=1, description="One catalogue line shown to the conductor")
    endpoint: str | None = Field(None, description="Base URL of an OpenAI-compatible API (…/v1)")
    api_key_env: str | None = Field(
        None, pattern=r"^[A-Z_][A-Z0-9_]*$", description="Name of the environment variable holding the key"
    )
    price_input_per_mtok: float = Field(0.0, ge=0, description="USD per million prompt tokens")
    price_output_per_mtok: float = Field(0.0, ge=0, description="USD per million completion tokens")
    max_tokens: int = Field(
        4096, gt=0, description="Per-seat floor: a generic low cap truncates reasoning models mid-thought"
    )
    concurrency: int = Field(8, gt=0, description="In-flight calls this seat accepts")
    temperature: float = Field(0.2, ge=0, description="Sampling temperature for workflow steps (paper: 0.2)")
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout; a timeout is transient")
    family: str | None = Field(None, description="Model family, a world-model feature")
    params_b: float | None = Field(None, gt=0, description="Parameter count in billions, if public")
    replay_source: Literal["zeroeval", "routerdc"] | None = Field(
        None, description="Recorded-answer source for replay seats"
    )
    vllm: VllmSeatConfig | None = None
    stop_when_first_agree: int | None = Field(
        None,
        ge=2,
        description=(
            "Vote seats only: when the first N steps the vote sees all give the same answer (the grader's "
            "equivalence), the steps before the vote that have not run are skipped and the vote answers; "
            "an agreement cascade the conductor writes"
        ),
    )

    @field_validator("description")
    @classmethod
    def _not_blank(cls, description: str) -> str:
        if not description.strip():
            raise ValueError("blank: the conductor chooses workers by this line, so say what the worker is")
        return description

    @model_validator(mode="after")
    def _backend_needs(self) -> WorkerSeat:
        if self.needs_endpoint and not self.endpoint:
            raise ValueError("an openai seat needs `endpoint`")
        if self.is_replay and self.replay_source is None:
            raise ValueError("a replay seat needs `replay_source` (zeroeval or routerdc)")
        if self.is_vote:
            # A vote calls no model: a field that configures one would be silently ignored.
            stray = [name for name in _MODEL_CALL_FIELDS if getattr(self, name)]
            if stray:
                raise ValueError(f"a vote seat calls no model and costs nothing; remove {stray}")
        elif self.stop_when_first_agree is not None:
            raise ValueError("`stop_when_first_agree` is a vote seat's stopping rule; this seat is not a vote")
        return self

    @property
    def is_conductor(self) -> bool:
        """The conductor itself as a seat: the orchestrator answers it with its conductor policy, no Worker does."""
        return self.backend == Backend.CONDUCTOR

    @property
    def is_vote(self) -> bool:
        """The aggregator: answers with the majority of the answers in the steps it is shown."""
        return self.backend == Backend.VOTE

    @property
    def answers_alone(self) -> bool:
        """Whether the seat can answer a question by itself. The conductor (it writes a workflow)
        and the vote (it only aggregates what it is shown) cannot: they are not probed, have no
        pass rates, and are no candidates for solo arms, routers or oracle ceilings."""
        return not (self.is_conductor or self.is_vote)

    @property
    def is_replay(self) -> bool:
        """Answered from recordings: no latency is measured and token counts are estimates."""
        return self.backend == Backend.REPLAY

    @property
    def is_vllm(self) -> bool:
        """Served by a local `vllm serve` that the vLLM launcher starts (and which gives it its endpoint)."""
        return self.backend == Backend.VLLM

    @property
    def needs_endpoint(self) -> bool:
        """The pool file itself must give `endpoint` (a vllm seat gets its own from the launcher)."""
        return self.backend == Backend.OPENAI

    def cost_usd(self, prompt_tokens: int | None, completion_tokens: int | None) -> float:
        """Price of one call from its token counts."""
        return (
            (prompt_tokens or 0) * self.price_input_per_mtok
            + (completion_tokens or 0) * self.price_output_per_mtok
        ) / 1e6


class GovernorConfig(BaseModel):
    """Pool-wide limits on calls in flight and on request and token rates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_in_flight: int = Field(64, gt=0, description="Calls in flight across all seats")
    requests_per_minute: float | None = Field(None, gt=0)
    tokens_per_minute: float | None = Field(None, gt=0)


class RetryConfig(BaseModel):
    """Backoff for transient faults (429, 5xx, timeouts, resets). They are retried, never scored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(6, ge=1)
    base_delay_s: float = Field(0.5, ge=0)
    max_delay_s: float = Field(30.0, ge=0)


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    workers: list[WorkerSeat] = Field(min_length=1)
    governor: GovernorConfig = GovernorConfig()
    retry: RetryConfig = RetryConfig()

    @model_validator(mode="after")
    def _unique_names(self) -> PoolConfig:
        names = [w.name for w in self.workers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"worker names must be unique; repeated: {dupes}")
        return self

    @property
    def worker_names(self) -> list[str]:
        return [w.name for w in self.workers]

    @property
    def solo_worker_names(self) -> list[str]:
        """Seats that answer a question alone (`WorkerSeat.answers_alone`): the probe partitions,
        and the workers of pass rates, ceilings, solo arms and routers."""
        return [w.name for w in self.workers if w.answers_alone]

    @property
    def vote_seat_names(self) -> list[str]:
        """The vote seats: the warm start's fan-out targets, and the aggregators whose fan-out share
        training curves report."""
        return [w.name for w in self.workers if w.is_vote]

    def seat(self, name: str) -> WorkerSeat:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(f"pool {self.name!r} has no worker {name!r}; workers: {self.worker_names}")


def pool_path(name_or_path: str | Path) -> Path:
    """`replay-mixed6` -> data/pools/replay-mixed6.yaml; an existing path is used as is."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return POOLS_DIR / f"{name_or_path}.yaml"


def load_pool(name_or_path: str | Path) -> PoolConfig:
    """Read and validate a pool file; every error names the file and the offending field."""
    path = pool_path(name_or_path)
    try:
        raw = parse_yaml(path.read_text())
    except FileNotFoundError:
        available = sorted(p.stem for p in POOLS_DIR.glob("*.yaml"))
        raise PoolConfigError(f"{path}: no such pool file (shipped pools: {available})") from None
    except yaml.YAMLError as exc:
        raise PoolConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise PoolConfigError(f"{path}: expected a mapping with `name` and `workers`, got {type(raw).__name__}")
    try:
        return PoolConfig.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = _describe_location(err["loc"], raw)
            problems.append(f"{path}: {loc}: {err['msg']}")
        raise PoolConfigError("\n".join(problems)) from None


def _describe_location(loc: tuple, raw: Mapping) -> str:
    """`('workers', 2, 'backend')` -> `workers[2] (name 'q9').backend`, so the message names the worker."""
    parts: list[str] = []
    node: object = raw
    for key in loc:
        if isinstance(key, int):
            label = f"[{key}]"
            if isinstance(node, list) and key < len(node) and isinstance(node[key], dict) and "name" in node[key]:
                label += f" (worker {node[key]['name']!r})"
            parts.append(label)
            node = node[key] if isinstance(node, list) and key < len(node) else None
        else:
            parts.append(("." if parts else "") + str(key))
            node = node.get(key) if isinstance(node, dict) else None
    return "".join(parts) or "<top level>"


def check_api_keys(pool: PoolConfig, environ: Mapping[str, str] | None = None) -> None:
    """Fail before the first call when a seat's key variable is unset (the key itself is never read out)."""
    env = os.environ if environ is None else environ
    missing = [
        f"worker {w.name!r} needs environment variable {w.api_key_env}"
        for w in pool.workers
        if w.api_key_env and not env.get(w.api_key_env)
    ]
    if missing:
        raise MissingApiKeyError(f"pool {pool.name!r}: " + "; ".join(missing))
