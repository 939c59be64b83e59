"""The GRPO reward of one rollout: the paper's 0 / 0.5 / 1, as a TRL reward function.

What this relies on in TRL 1.16 (trl/trainer/grpo_trainer.py):
- A reward function may return None per completion; TRL turns it into NaN, leaves the completion
  out of its group's mean and std and of the logged `reward`/`reward_std`, and gives it advantage 0.
  Infrastructure failures are reported that way: excluded, never scored.
- A group with fewer than two scorable completions has a NaN std, which `frac_reward_zero_std`
  does NOT count as flat; `conductor/frac_groups_no_signal` (logged here) does.
- Reward functions get every dataset column as a list keyword, plus `completion_ids`,
  `trainer_state`, `log_extra` and `log_metric`; `log_metric(name, value)` is averaged per logging
  step into the trainer's logs. With one generation batch per optimizer step (what
  `GRPOSettings.gradient_accumulation_steps` arranges), one reward call holds exactly the rollouts
  of step `trainer_state.global_step + 1`.
"""

from __future__ import annotations

import inspect
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from conductor_pipeline.workflow import PARSE_OK

# Keys the reward adds to each rollout's row next to the dataset columns: its position in the
# generation batch, and the optimizer step it belongs to (None outside a trainer).
ROLLOUT_POSITION = "rollout_position"
TRAINING_STEP = "training_step"
# The outcome tallied for a parsed rollout excluded as an infrastructure failure (not scored).
INFRASTRUCTURE = "infrastructure"

# --- the reward ------------------------------------------------------------------------------

RewardVariant = Literal["paper", "strict"]
# (unparseable, parsed but wrong, correct): the paper rewards a parseable workflow with 0.5 so an
# untrained policy gets a format gradient; "strict" rewards only correct answers.
REWARD_TABLE: dict[str, tuple[float, float, float]] = {
    "paper": (0.0, 0.5, 1.0),
    "strict": (0.0, 0.0, 1.0),
}
# Reward-kwargs TRL adds on top of the dataset columns; they are not part of a row.
_TRL_REWARD_EXTRAS = frozenset({"trainer_state", "log_extra", "log_metric", "environments"})
REWARD_FUNC_NAME = "conductor_reward"  # TRL logs `rewards/<name>/mean` under this name


@dataclass(frozen=True, slots=True)
class RolloutVerdict:
    """What executing one sampled workflow produced, before it becomes a reward.

    `parse_code` is "ok" or a `WorkflowParseError` code. `correct` is None when the workflow
    parsed but its execution hit an infrastructure failure (transient errors after retries,
    `not_recorded` replay): such rollouts are excluded from their group, never scored.
    """

    parse_code: str
    correct: bool | None = None
    cost_usd: float = 0.0
    # The world model's P(success) for the worker whose answer is final; None when W is not used.
    expected_success: float | None = None
    # The worker whose answer is final (None unparsed), and whether the workflow fanned out to several
    # workers and aggregated them with a vote seat (None on a pool without one): what the curves show.
    final_worker: str | None = None
    fans_out: bool | None = None

    @property
    def infrastructure_failure(self) -> bool:
        return self.parse_code == PARSE_OK and self.correct is None


def reward_for(
    verdict: RolloutVerdict | None,
    variant: RewardVariant = "paper",
    *,
    cost_weight: float = 0.0,
    bonus_weight: float = 0.0,
) -> float | None:
    """The scalar reward of one rollout; None (excluded by TRL) for infrastructure failures."""
    if verdict is None or verdict.infrastructure_failure:
        return None
    unparseable, parsed_wrong, correct = REWARD_TABLE[variant]
    if verdict.parse_code != PARSE_OK:
        return unparseable
    base = correct if verdict.correct else parsed_wrong
    bonus = 0.0
    if verdict.expected_success is not None:
        bonus = routing_bonus(verdict.expected_success, bool(verdict.correct), bonus_weight)
    return base - cost_weight * verdict.cost_usd + bonus


def routing_bonus(predicted: float, correct: bool, weight: float = 0.0) -> float:
    """Reward bonus when a routing decision beats W's expectation: weight * max(0, correct - predicted).

    OFF by default (weight 0) and meant to be tried LAST and carefully: it rewards the policy for
    W's mistakes as much as for good routing (a worker W underrates becomes a bonus farm), it
    makes the reward depend on a model that is itself trained on the policy's own telemetry, and
    it adds variance to the GRPO advantage. Use only with a W that beat the marginal baselines on
    held-out questions, with a small weight, and compare against a run without it.
    """
    if weight == 0.0:
        return 0.0
    if not 0.0 <= predicted <= 1.0:
        raise ValueError(f"predicted must be a probability, got {predicted}")
    return weight * max(0.0, float(correct) - predicted)


SyncExecute = Callable[[str, dict], "RolloutVerdict | None"]
AsyncExecute = Callable[[str, dict], Awaitable["RolloutVerdict | None"]]


def completion_text(completion: str | list[dict]) -> str:
    """TRL hands conversational completions as message lists; the workflow is the assistant text."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role", "assistant") == "assistant")


class _RewardTally:
    """Thread-safe per-step tally of parse codes (the reward may run on TRL's async loop thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, codes: Iterable[str]) -> None:
        with self._lock:
            self._counts.update(codes)

    def drain(self) -> dict[str, int]:
        with self._lock:
            counts, self._counts = dict(self._counts), Counter()
        return counts


class _ConductorRewardBase:
    __name__ = REWARD_FUNC_NAME

    def __init__(
        self, execute: Callable, variant: RewardVariant, cost_weight: float, group_size: int | None, bonus_weight: float
    ):
        if variant not in REWARD_TABLE:
            raise ValueError(f"reward variant must be one of {sorted(REWARD_TABLE)}, got {variant!r}")
        self.execute = execute
        self.variant = variant
        self.cost_weight = cost_weight
        self.bonus_weight = bonus_weight
        self.group_size = group_size
        self.tally = _RewardTally()

    def drain_counts(self) -> dict[str, int]:
        """Rollout outcome counts since the last drain: parse codes plus `infrastructure`."""
        return self.tally.drain()

    @staticmethod
    def _rows(prompts: list, kwargs: dict[str, Any]) -> list[dict]:
        """Each rollout's dataset row, plus its position in the batch and the optimizer step it
        belongs to (the step the trainer is taking: one past the completed `global_step`)."""
        columns = {k: v for k, v in kwargs.items() if k not in _TRL_REWARD_EXTRAS and isinstance(v, list)}
        state = kwargs.get("trainer_state")
        step = int(state.global_step) + 1 if state is not None and hasattr(state, "global_step") else None
        return [
            {"prompt": prompt, **{k: v[i] for k, v in columns.items()}, ROLLOUT_POSITION: i, TRAINING_STEP: step}
            for i, prompt in enumerate(prompts)
        ]

    def _finish(self, verdicts: list[RolloutVerdict | None], log_metric: Callable | None) -> list[float | None]:
        rewards = [
            reward_for(v, self.variant, cost_weight=self.cost_weight, bonus_weight=self.bonus_weight) for v in verdicts
        ]
        codes = [INFRASTRUCTURE if v is None or v.infrastructure_failure else v.parse_code for v in verdicts]
        self.tally.add(codes)
        if log_metric is not None and verdicts:
            total = len(verdicts)
            log_metric("conductor/parse_fail_rate", sum(c not in (PARSE_OK, INFRASTRUCTURE) for c in codes) / total)
            log_metric("conductor/infra_fail_rate", codes.count(INFRASTRUCTURE) / total)
            no_signal = frac_groups_without_signal(rewards, self.group_size)
            if no_signal is not None:
                log_metric("conductor/frac_groups_no_signal", no_signal)
            same_correctness = frac_groups_without_signal([correctness(v) for v in verdicts], self.group_size)
            if same_correctness is not None:
                log_metric("conductor/frac_same_correctness", same_correctness)
            for name, value in routing_metrics(verdicts).items():
                log_metric(f"conductor/{name}", value)
        return rewards


def routing_metrics(verdicts: Sequence[RolloutVerdict | None]) -> dict[str, float]:
    """What a step's scored, parsed rollouts routed to: their accuracy (`parsed_accuracy`, the
    routing curve once the format is learnt), what they paid for their calls (`parsed_cost_usd`, the
    spending curve), each final worker's share (`final_worker/<name>`) and, on a pool with a vote
    seat, the share that fanned out and aggregated (`fan_out_share`)."""
    parsed = [v for v in verdicts if v is not None and v.parse_code == PARSE_OK and v.correct is not None]
    if not parsed:
        return {}
    metrics = {
        "parsed_accuracy": sum(bool(v.correct) for v in parsed) / len(parsed),
        "parsed_cost_usd": sum(v.cost_usd for v in parsed) / len(parsed),
    }
    for worker, count in Counter(v.final_worker for v in parsed if v.final_worker).items():
        metrics[f"final_worker/{worker}"] = count / len(parsed)
    flags = [v.fans_out for v in parsed if v.fans_out is not None]
    if flags:
        metrics["fan_out_share"] = sum(flags) / len(flags)
    return metrics


def correctness(verdict: RolloutVerdict | None) -> float | None:
    """1 for a correct rollout, 0 for any other scored one (unparseable or wrong: format ignored),
    None for an infrastructure failure (not scored)."""
    if verdict is None or verdict.infrastructure_failure:
        return None
    return float(verdict.parse_code == PARSE_OK and bool(verdict.correct))


def frac_groups_without_signal(rewards: Sequence[float | None], group_size: int | None) -> float | None:
    """Share of consecutive groups whose scorable rewards cannot differ (all equal, or < 2 scored).

    TRL lays a generation batch out as `group_size` consecutive completions per prompt. Unlike
    TRL's `frac_reward_zero_std`, a group with fewer than two scored rollouts counts as no signal.
    """
    if not group_size or len(rewards) % group_size:
        return None
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    flat = 0
    for group in groups:
        scored = [r for r in group if r is not None]
        flat += len(scored) < 2 or max(scored) - min(scored) < 1e-9
    return flat / len(groups)


class ConductorReward(_ConductorRewardBase):
    """TRL reward function: executes each sampled workflow with a synchronous `execute`."""

    def __call__(self, prompts: list, completions: list, log_metric: Callable | None = None, **kwargs: Any) -> list[float | None]:
        rows = self._rows(prompts, kwargs)
        verdicts = [self.execute(completion_text(c), row) for c, row in zip(completions, rows, strict=True)]
        return self._finish(verdicts, log_metric)


class AsyncConductorReward(_ConductorRewardBase):
    """TRL reward function for an async `execute`: all rollouts of a batch run concurrently.

    TRL detects the async `__call__` and awaits it on its own event-loop thread.
    """

    async def __call__(self, prompts: list, completions: list, log_metric: Callable | None = None, **kwargs: Any) -> list[float | None]:
        import asyncio

        rows = self._rows(prompts, kwargs)
        verdicts = await asyncio.gather(
            *(self.execute(completion_text(c), row) for c, row in zip(completions, rows, strict=True))
        )
        flush = getattr(self.execute, "flush", None)
        if flush is not None:  # an executor that records: one batch of rows per reward call
            await flush()
        return self._finish(list(verdicts), log_metric)


def make_conductor_reward(
    execute: SyncExecute | AsyncExecute,
    variant: RewardVariant = "paper",
    *,
    cost_weight: float = 0.0,
    group_size: int | None = None,
    bonus_weight: float = 0.0,
) -> ConductorReward | AsyncConductorReward:
    """Wrap `execute(completion_text, row) -> RolloutVerdict | None` as a TRL reward function.

    `row` holds the dataset columns of that rollout's prompt (e.g. `question_id`, `workers`) and
    `prompt`. `execute` parses the workflow against `row["workers"]` and runs it through the
    orchestrator; returning None (or a verdict with `correct=None`) marks an infrastructure
    failure. Pass `group_size` (= num_generations) to log `conductor/frac_groups_no_signal`.
    `bonus_weight` > 0 adds `routing_bonus` to verdicts that carry W's `expected_success`.
    """
    if inspect.iscoroutinefunction(execute) or inspect.iscoroutinefunction(getattr(execute, "__call__", None)):
        return AsyncConductorReward(execute, variant, cost_weight, group_size, bonus_weight)
    return ConductorReward(execute, variant, cost_weight, group_size, bonus_weight)
