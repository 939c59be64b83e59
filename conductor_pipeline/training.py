"""Training glue for the conductor: typed settings, the SFT warm start, GRPO with TRL, the reward.

Why this module exists: the paper's recipe (GRPO, 64 rollouts per question, 4 questions per
step, 200 steps, lr 1e-6, temperature 1.0, no KL, checkpoints every 10 steps) must be one typed
object whose defaults ARE the paper, with a CPU profile that runs the same code path in minutes
on a laptop (tiny model, tiny groups) and a GPU profile (Qwen2.5 + vLLM rollouts) that is built
and checked even where no GPU is lent. Dagster never appears here; `resources/` and `assets/`
wrap these functions.

TRL 1.16 behaviours this module relies on (verified in the installed source, trl/trainer/):
- A reward function may return `None` per completion: `_calculate_rewards` turns it into NaN;
  a completion whose every reward is NaN is "unscorable": excluded from the group mean/std
  (nanmean/nanstd), advantage forced to 0, excluded from the logged `reward`/`reward_std`.
  A group with fewer than two scorable completions has NaN std and is NOT counted in
  `frac_reward_zero_std` (torch.isclose(nan, 0) is False), so we log our own
  `conductor/frac_groups_no_signal`, which does count them.
- Reward functions receive every dataset column as a list kwarg, plus `trainer_state`,
  `log_extra` and `log_metric`; `log_metric(name, value)` values are averaged per logging step
  and appear in the trainer's logs next to the built-in keys.
- Per-step log keys (logging_steps=1): `loss`, `grad_norm`, `learning_rate`, `reward`,
  `reward_std`, `frac_reward_zero_std`, `rewards/<func name>/mean|std`, `completions/mean_length`,
  `completions/min_length`, `completions/max_length`, `completions/clipped_ratio`,
  `completions/mean_terminated_length`, `num_tokens`, `entropy`, `clip_ratio/*`, `kl` (beta>0).
- Resume: `Trainer.train(resume_from_checkpoint=<dir>)` restores weights, optimizer, scheduler,
  RNG and `global_step`; a larger `max_steps` on the rerun continues the count.
- `DefaultFlowCallback` saves at `save_steps` multiples and at `max_steps`; an early stop (a
  callback setting `should_training_stop`) does not save by itself, so `train_grpo` does.

The CPU profile, choice by choice (measured with scripts/tune_cpu_conductor.py on a copy of a
finished default run: pool replay-mixed6, 390 contested questions; parse rate = share of 64
samples at temperature 1 that parse; 2 shared cores, so seconds are +-30%):
- Starting point (64-wide 2-layer model, "paper" warm-start targets, 120 SFT steps at lr 1e-2,
  groups of 4, completion cap 96): parse rate 0.06 after the warm start, 0.725 of the probe's
  40 groups without reward variance: the gate (rightly) refused to train.
- The completion cap cut a third of the lessons: a three-step "paper" target is ~130 tiny-tokens,
  the cap was 96, so every sampled three-step workflow was truncated. The CPU profile's targets
  are now "compact" (lists only, four fixed phrasings; `conductor_pipeline.synthetic`), at most
  64 tokens with the end-of-turn token; the cap is 80 (a test checks every target fits).
- The tokenizer had never seen the conductor's prompt nor the targets' wording ("Give" was two
  tokens): its corpus now holds the shipped pools' conductor prompts and rendered targets, so a
  six-worker prompt is 601 tokens instead of 875: every SFT and GRPO step reads ~30% fewer.
- Compact targets alone (same 64x2 model, 120 steps): parse rate 0.73, loss 0.096.
- The warm start trains on exactly the GRPO prompts (same sub-pools, naming, catalogue text).
- Sub-pools keep the routing decision (`conductor_prompt_rows(must_show=...)`): with uniform
  random sub-pools, a question shown only workers that all solve it (common: 168 of the 390 are
  missed by one worker only) scores every rollout alike whatever the policy writes; computed
  from the recorded answers, a perfectly formatted, uniformly routing policy would leave 0.47 of
  groups of 4 flat (0.34 of groups of 8). Showing one of the question's best and one of its worst
  workers in every sub-pool brings that floor to 0.25 (groups of 4) and 0.075 (groups of 8).
- Groups of 8 (the paper: 64; TRL reports the group size next to the figure): with groups of 4,
  the 64x2 compact model's probe had 0.25 of 20 groups flat (the gate fails); groups of 8 cost
  ~2.5 s per step here and leave ~0.05.
- 128 wide, 2 layers: per SFT step about as cheap as 64 wide on 2 cores (both are
  overhead-bound) and learns the format in fewer steps: 0.78 parse rate at 120 steps, 0.89 at
  200. 4 layers (lr 5e-3, 160 steps): 0.84, but ~1.8x the SFT time, over the time budget;
  192 wide (lr 5e-3, 120 steps): 0.63.
- SFT lr 7e-3, 10% warmup, 160 steps (cosine): lr 1e-2 was at the edge of stability (seed 1: loss
  stuck at 0.26, parse rate 0.02; lr 2e-2 diverged); 7e-3 over 160 steps gave 0.77 / 0.73 parse
  rate on seeds 0 / 1 in ~2.5 minutes. 256 pairs (3-5 passes) beat 960 pairs seen once (0.47).
- Temperature stays the paper's 1.0: it is what the gate and GRPO sample at, and the spread over
  workers it gives is the exploration GRPO needs.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from conductor_pipeline.paths import write_json_atomic
from conductor_pipeline.workflow import PARSE_OK

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
# The paper trains a 7B conductor (1.5B fits one 24-48 GB GPU with colocated vLLM).
PAPER_POLICY = "Qwen/Qwen2.5-7B-Instruct"
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
        columns = {k: v for k, v in kwargs.items() if k not in _TRL_REWARD_EXTRAS and isinstance(v, list)}
        return [{"prompt": prompt, **{k: v[i] for k, v in columns.items()}} for i, prompt in enumerate(prompts)]

    def _finish(self, verdicts: list[RolloutVerdict | None], log_metric: Callable | None) -> list[float | None]:
        rewards = [
            reward_for(v, self.variant, cost_weight=self.cost_weight, bonus_weight=self.bonus_weight) for v in verdicts
        ]
        codes = ["infrastructure" if v is None or v.infrastructure_failure else v.parse_code for v in verdicts]
        self.tally.add(codes)
        if log_metric is not None and verdicts:
            total = len(verdicts)
            log_metric("conductor/parse_fail_rate", sum(c not in (PARSE_OK, "infrastructure") for c in codes) / total)
            log_metric("conductor/infra_fail_rate", codes.count("infrastructure") / total)
            no_signal = frac_groups_without_signal(rewards, self.group_size)
            if no_signal is not None:
                log_metric("conductor/frac_groups_no_signal", no_signal)
        return rewards


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


# --- prompts: the training dataset and randomised pools ------------------------------------


def conductor_prompt_rows(
    questions: Sequence[Any],
    workers: Sequence[str],
    build_messages: Callable[[Any, Sequence[str]], list[dict]],
    *,
    randomize_pools: bool = False,
    min_pool_size: int = 2,
    seed: int = 0,
    question_id: Callable[[Any], str] = lambda q: q.question_id,
    must_show: Callable[[Any], Sequence[Sequence[str]]] | None = None,
) -> list[dict]:
    """One GRPO dataset row per question: `prompt` (chat messages), `question_id`, `workers`.

    With `randomize_pools` (the paper), each question shows a random subset of the pool (at least
    `min_pool_size` workers, order shuffled), so the policy learns to route over unseen pools;
    `workers` records exactly what that prompt displayed, which the reward's parser must use.
    `must_show(question)` gives groups of workers; each random subset then holds one worker of
    every (non-empty) group, e.g. (solvers, failers) so that a contested question stays contested
    in the sub-pool it is shown with (see `routing_anchors`).
    """
    rng = random.Random(seed)
    rows = []
    for question in questions:
        shown = list(workers)
        if randomize_pools and len(shown) > min_pool_size:
            size = rng.randint(min_pool_size, len(shown))
            if must_show is None:
                shown = rng.sample(shown, size)
            else:
                anchors: list[str] = []
                for group in must_show(question):
                    options = [w for w in group if w in shown and w not in anchors]
                    if options:
                        anchors.append(rng.choice(options))
                rest = [w for w in shown if w not in anchors]
                shown = anchors[:size] + rng.sample(rest, max(0, size - len(anchors)))
                rng.shuffle(shown)  # anchors at fixed positions would teach position, not routing
        rows.append(
            {"prompt": build_messages(question, shown), "question_id": question_id(question), "workers": shown}
        )
    return rows


# --- settings ----------------------------------------------------------------------------------


def _help(text: str) -> dict[str, str]:
    return {"help": text}


TINY_POLICY = "tiny"  # the offline model from conductor_pipeline.tiny_models (CPU profile)
# The tiny CPU policy's shape (see the module docstring for the measurements behind it).
CPU_POLICY_HIDDEN_SIZE = 128
CPU_POLICY_LAYERS = 2


@dataclass(frozen=True)
class GRPOSettings:
    """Every GRPO knob of the conductor run; the defaults are the Conductor paper's."""

    policy_model: str = field(default=PAPER_POLICY, metadata=_help(
        "Policy to train: a hub id / local path, or 'tiny' for the offline CPU model."))
    num_generations: int = field(default=64, metadata=_help(
        "Group size: rollouts sampled per question (paper 64). Small groups are more often all-equal."))
    questions_per_step: int = field(default=4, metadata=_help(
        "Distinct questions per optimizer step (paper 4); a step sees questions_per_step x num_generations rollouts."))
    max_steps: int = field(default=200, metadata=_help("Optimizer steps, the paper's 'iterations' (200)."))
    learning_rate: float = field(default=1e-6, metadata=_help("AdamW learning rate (paper 1e-6)."))
    temperature: float = field(default=1.0, metadata=_help("Rollout sampling temperature (paper 1.0)."))
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling for rollouts; 1.0 = plain temperature sampling."))
    max_completion_length: int = field(default=1024, metadata=_help(
        "Token cap on a sampled workflow (reasoning + lists); truncated rollouts usually fail to parse."))
    beta: float = field(default=0.0, metadata=_help("KL coefficient to the reference policy (paper: no KL, 0.0)."))
    loss_type: str = field(default="grpo", metadata=_help(
        "TRL loss aggregation: 'grpo' (per-sequence mean, the paper's GRPO) or 'dapo'/'dr_grpo'/... (TRL default dapo)."))
    scale_rewards: str = field(default="group", metadata=_help(
        "Advantage scaling: 'group' (standard GRPO), 'batch', or 'none' (Dr. GRPO)."))
    num_iterations: int = field(default=1, metadata=_help("Policy updates per generation batch (GRPO's mu)."))
    save_steps: int = field(default=10, metadata=_help(
        "Checkpoint every N steps (the reproduction's requirement: 10); a rerun resumes from the latest."))
    save_total_limit: int | None = field(default=None, metadata=_help("Keep at most this many checkpoints; None keeps all."))
    reward_variant: RewardVariant = field(default="paper", metadata=_help(
        "'paper': 0 unparseable / 0.5 parsed but wrong / 1 correct; 'strict': 0 / 0 / 1."))
    cost_weight: float = field(default=0.0, metadata=_help(
        "Reward penalty per USD of worker cost; 0 keeps cost out of the reward (the paper)."))
    world_model_bonus_weight: float = field(default=0.0, metadata=_help(
        "Reward bonus weight * max(0, correct - W's P(success) of the final worker); 0 (off) by default. "
        "The last and most careful use of W: see `routing_bonus`."))
    randomize_pools: bool = field(default=True, metadata=_help(
        "Show each training question a random subset of the pool (the paper's randomised pools)."))
    min_pool_size: int = field(default=2, metadata=_help("Smallest random pool subset shown to the policy."))
    per_device_train_batch_size: int = field(default=8, metadata=_help(
        "Rollouts per forward/backward micro-batch; gradient accumulation makes up a full step."))
    num_processes: int = field(default=1, metadata=_help(
        "Training processes (GPUs) under accelerate; used to derive gradient accumulation."))
    gradient_checkpointing: bool = field(default=True, metadata=_help("Trade compute for memory (large models)."))
    bf16: bool = field(default=True, metadata=_help("bfloat16 mixed precision (GPU); off on CPU."))
    use_vllm: bool = field(default=False, metadata=_help("Generate rollouts with vLLM instead of transformers."))
    vllm_mode: Literal["colocate", "server"] = field(default="colocate", metadata=_help(
        "'colocate': vLLM shares the training GPU; 'server': a separate `trl vllm-serve` process."))
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata=_help(
        "Colocate mode: GPU memory share vLLM may take; the rest trains the policy."))
    vllm_server_base_url: str | None = field(default=None, metadata=_help(
        "Server mode: base URL of `trl vllm-serve` (e.g. http://127.0.0.1:8000)."))
    use_cpu: bool = field(default=False, metadata=_help("Train on CPU even when a GPU is visible (CPU profile)."))
    seed: int = field(default=0, metadata=_help("Seed for sampling, data order and pool randomisation."))

    @property
    def rollouts_per_step(self) -> int:
        return self.questions_per_step * self.num_generations

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per step, so one optimizer step consumes exactly one generation batch."""
        per_pass = self.per_device_train_batch_size * self.num_processes
        if self.rollouts_per_step % per_pass:
            raise ValueError(
                f"questions_per_step x num_generations ({self.rollouts_per_step}) must be divisible by "
                f"per_device_train_batch_size x num_processes ({per_pass})"
            )
        return self.rollouts_per_step // per_pass

    @classmethod
    def cpu_profile(cls, **overrides: Any) -> GRPOSettings:
        """The embedded default and CI: the tiny offline model, groups of 8, a few dozen steps.

        lr is far above the paper's: a tiny model moves nowhere at 1e-6 in 24 steps. Groups of 8
        and the 80-token cap: see the module docstring.
        """
        settings = cls(
            policy_model=TINY_POLICY,
            num_generations=8,
            questions_per_step=2,
            max_steps=24,
            learning_rate=1e-4,
            max_completion_length=80,
            per_device_train_batch_size=8,
            gradient_checkpointing=False,
            bf16=False,
            use_cpu=True,
            use_vllm=False,
            randomize_pools=True,
        )
        return replace(settings, **overrides)

    @classmethod
    def gpu_profile(
        cls,
        model: str = PAPER_POLICY,
        *,
        vllm_mode: Literal["colocate", "server"] = "colocate",
        **overrides: Any,
    ) -> GRPOSettings:
        """The paper's run: Qwen2.5 policy, vLLM rollouts, bf16, every paper default kept."""
        settings = cls(
            policy_model=model,
            use_vllm=True,
            vllm_mode=vllm_mode,
            bf16=True,
            gradient_checkpointing=True,
            per_device_train_batch_size=8,
            vllm_server_base_url="http://127.0.0.1:8000" if vllm_mode == "server" else None,
        )
        return replace(settings, **overrides)

    def to_grpo_config(self, output_dir: str | Path, **overrides: Any):
        """A real `trl.GRPOConfig`: one optimizer step per generation batch, log every step.

        transformers validates bf16 against the hardware, so the GPU profile's config can only be
        built where a bf16 GPU is present; `grpo_config_kwargs` is the hardware-free part.
        """
        from trl import GRPOConfig

        return GRPOConfig(**self.grpo_config_kwargs(output_dir, **overrides))

    def grpo_config_kwargs(self, output_dir: str | Path, **overrides: Any) -> dict[str, Any]:
        """The keyword arguments `to_grpo_config` passes to `trl.GRPOConfig`."""
        kwargs: dict[str, Any] = dict(
            output_dir=str(output_dir),
            num_generations=self.num_generations,
            per_device_train_batch_size=self.per_device_train_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            max_steps=self.max_steps,
            learning_rate=self.learning_rate,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=0,
            max_completion_length=self.max_completion_length,
            beta=self.beta,
            loss_type=self.loss_type,
            scale_rewards=self.scale_rewards,
            num_iterations=self.num_iterations,
            save_strategy="steps",
            save_steps=self.save_steps,
            save_total_limit=self.save_total_limit,
            logging_steps=1,
            seed=self.seed,
            data_seed=self.seed,
            bf16=self.bf16,
            gradient_checkpointing=self.gradient_checkpointing,
            use_cpu=self.use_cpu,
            use_vllm=self.use_vllm,
            vllm_mode=self.vllm_mode,
            vllm_gpu_memory_utilization=self.vllm_gpu_memory_utilization,
            vllm_server_base_url=self.vllm_server_base_url,
            remove_unused_columns=False,  # the reward needs question_id / workers columns
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        if self.bf16:
            kwargs["model_init_kwargs"] = {"dtype": "bfloat16"}
        kwargs.update(overrides)
        return kwargs

    def describe(self) -> dict[str, Any]:
        """Flat knob -> value mapping for asset metadata."""
        return asdict(self)


@dataclass(frozen=True)
class SFTSettings:
    """Supervised warm start: teach the policy the workflow format before GRPO."""

    learning_rate: float = field(default=1e-5, metadata=_help("AdamW learning rate."))
    max_steps: int = field(default=200, metadata=_help("Optimizer steps (-1: use num_train_epochs)."))
    num_train_epochs: float = field(default=1.0, metadata=_help("Epochs when max_steps is -1."))
    per_device_train_batch_size: int = field(default=8, metadata=_help("Examples per micro-batch."))
    gradient_accumulation_steps: int = field(default=1, metadata=_help("Micro-batches per optimizer step."))
    max_length: int | None = field(default=2048, metadata=_help("Token cap on prompt + completion."))
    completion_only_loss: bool = field(default=True, metadata=_help(
        "Train on the workflow text only, not on the prompt (the catalogue and question)."))
    warmup_steps: float = field(default=0.0, metadata=_help(
        "Linear warmup: an int is steps, a float in [0, 1) a share of all steps (transformers 5)."))
    bf16: bool = field(default=True, metadata=_help("bfloat16 mixed precision (GPU); off on CPU."))
    gradient_checkpointing: bool = field(default=True, metadata=_help("Trade compute for memory (large models)."))
    use_cpu: bool = field(default=False, metadata=_help("Train on CPU even when a GPU is visible (CPU profile)."))
    seed: int = field(default=0, metadata=_help("Seed for data order and initialisation."))

    @classmethod
    def cpu_profile(cls, **overrides: Any) -> SFTSettings:
        """Tiny model, high lr, short run: enough for the format to appear in samples.

        The last tenths of loss are what make sampled structure reliable. Measured on the real
        conductor prompts (module docstring): lr 7e-3 x 160 steps with 10% warmup, parse rate
        ~0.75 at temperature 1 on two seeds; lr 1e-2 was unstable on one seed of two.
        """
        settings = cls(
            learning_rate=7e-3,
            max_steps=160,
            per_device_train_batch_size=8,
            max_length=1024,
            warmup_steps=0.1,
            bf16=False,
            use_cpu=True,
            gradient_checkpointing=False,
        )
        return replace(settings, **overrides)

    @classmethod
    def gpu_profile(cls, **overrides: Any) -> SFTSettings:
        return replace(cls(learning_rate=1e-5, max_steps=100, bf16=True, gradient_checkpointing=True), **overrides)

    def to_sft_config(self, output_dir: str | Path, **overrides: Any):
        from trl import SFTConfig

        kwargs: dict[str, Any] = dict(
            output_dir=str(output_dir),
            learning_rate=self.learning_rate,
            max_steps=self.max_steps,
            num_train_epochs=self.num_train_epochs,
            per_device_train_batch_size=self.per_device_train_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            max_length=self.max_length,
            completion_only_loss=self.completion_only_loss,
            warmup_steps=self.warmup_steps,
            lr_scheduler_type="cosine",
            bf16=self.bf16,
            gradient_checkpointing=self.gradient_checkpointing,
            use_cpu=self.use_cpu,
            seed=self.seed,
            data_seed=self.seed,
            logging_steps=1,
            save_strategy="no",  # a warm start is cheap to redo; the final model is saved explicitly
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        kwargs.update(overrides)
        return SFTConfig(**kwargs)


def settings_help(settings_class: type) -> dict[str, str]:
    """Field name -> help text, for docs and Dagster config descriptions."""
    return {f.name: f.metadata.get("help", "") for f in fields(settings_class)}


# --- SFT warm start ----------------------------------------------------------------------------

SFT_MANIFEST = "sft_manifest.json"
SFT_LOG_HISTORY = "sft_log_history.json"


def _examples_digest(model_path: Path, examples: Sequence[tuple[list[dict], str]], settings: SFTSettings) -> str:
    digest = hashlib.sha256(json.dumps({"model": str(model_path), "settings": asdict(settings)}, sort_keys=True).encode())
    for messages, completion in examples:
        digest.update(json.dumps([messages, completion], sort_keys=True).encode())
    return digest.hexdigest()[:16]


def warm_start_sft(
    model_path: str | Path,
    examples: Sequence[tuple[list[dict], str]],
    settings: SFTSettings,
    output_dir: str | Path,
) -> Path:
    """Fine-tune `model_path` on (prompt messages, target workflow text) pairs; return the model dir.

    Uses TRL's SFTTrainer on a conversational prompt-completion dataset, so the loss covers the
    assistant turn only and the model learns to close it with its end-of-turn token. Idempotent:
    an output_dir whose manifest matches (model, examples, settings) is returned untouched. The
    trainer's log history (loss per step) is written next to the model.
    """
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    model_path, output_dir = Path(model_path), Path(output_dir)
    if not examples:
        raise ValueError("warm_start_sft needs at least one example")
    digest = _examples_digest(model_path, examples, settings)
    manifest_path = output_dir / SFT_MANIFEST
    if manifest_path.is_file() and json.loads(manifest_path.read_text()).get("digest") == digest:
        return output_dir

    dataset = Dataset.from_list(
        [
            {"prompt": list(messages), "completion": [{"role": "assistant", "content": completion}]}
            for messages, completion in examples
        ]
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    trainer = SFTTrainer(
        model=str(model_path),
        args=settings.to_sft_config(output_dir),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model(str(output_dir))
    tokenizer.save_pretrained(output_dir)
    (output_dir / SFT_LOG_HISTORY).write_text(json.dumps(trainer.state.log_history, indent=1))
    write_json_atomic(manifest_path, {"digest": digest, "base_model": str(model_path), "examples": len(examples)})
    return output_dir


# --- GRPO ------------------------------------------------------------------------------------

StepCallback = Callable[[dict], "bool | None"]


@dataclass
class TrainingOutcome:
    """Where a GRPO run ended: its last checkpoint, step, per-step rows and how it got there."""

    checkpoint_dir: Path | None
    global_step: int
    steps: list[dict]
    resumed_from: Path | None
    stopped_early: bool
    group_size: int


def step_row(global_step: int, logs: dict[str, Any], parse_counts: dict[str, int], group_size: int) -> dict:
    """One `training_steps`-shaped row from a TRL log dict (canonical names first, raw logs kept)."""
    return {
        "step": global_step,
        "reward_mean": logs.get("reward"),
        "reward_std": logs.get("reward_std"),
        "frac_zero_std": logs.get("frac_reward_zero_std"),
        "frac_groups_no_signal": logs.get("conductor/frac_groups_no_signal"),
        "parse_fail_rate": logs.get("conductor/parse_fail_rate"),
        "infra_fail_rate": logs.get("conductor/infra_fail_rate"),
        "completion_length_mean": logs.get("completions/mean_length"),
        "clipped_ratio": logs.get("completions/clipped_ratio"),
        "loss": logs.get("loss"),
        "learning_rate": logs.get("learning_rate"),
        "group_size": group_size,
        "parse_code_counts": parse_counts,
        "trl_logs": dict(logs),
    }


def _make_callbacks(
    on_step: StepCallback | None,
    reward_fn: Any,
    group_size: int,
    rows: list[dict],
    stop_flag: dict[str, bool],
):
    from transformers import TrainerCallback

    class StepRowCallback(TrainerCallback):
        """Turns each training log into a step row; `on_step` returning True stops (and saves)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:  # skip the end-of-train summary log
                return control
            drain = getattr(reward_fn, "drain_counts", None)
            row = step_row(state.global_step, logs, drain() if drain else {}, group_size)
            rows.append(row)
            if on_step is not None and on_step(row):
                stop_flag["stopped"] = True
                control.should_training_stop = True
            if control.should_training_stop:
                control.should_save = True  # an early stop still leaves a checkpoint of this step
            return control

    return [StepRowCallback()]


def _last_checkpoint(output_dir: Path) -> Path | None:
    """The latest *complete* `checkpoint-N`: one whose trainer state was written.

    The Trainer writes `trainer_state.json` last; a process killed mid-save leaves a directory
    without it, and resuming from that (what `get_last_checkpoint` would pick) fails on every
    rerun. Such a directory is skipped (and overwritten when the rerun saves that step again).
    """
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    if not output_dir.is_dir():
        return None
    complete = [
        path for path in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*")
        if path.name.rsplit("-", 1)[1].isdigit() and (path / "trainer_state.json").is_file()
    ]
    return max(complete, key=_checkpoint_step, default=None)


def _checkpoint_step(checkpoint: Path | None) -> int:
    return int(checkpoint.name.rsplit("-", 1)[1]) if checkpoint else 0


def train_grpo(
    model_path: str | Path,
    prompts_dataset: Any,
    reward_fn: Callable,
    settings: GRPOSettings,
    output_dir: str | Path,
    *,
    on_step: StepCallback | None = None,
    resume: bool = True,
    max_steps_override: int | None = None,
) -> TrainingOutcome:
    """Run GRPO with TRL's GRPOTrainer; resume from the latest `checkpoint-*`; always checkpoint.

    `prompts_dataset` is a `datasets.Dataset` or a list of rows with a conversational `prompt`
    (see `conductor_prompt_rows`). `on_step(row)` gets one row per optimizer step (see
    `step_row`); returning True stops the run early, which still saves a checkpoint. An exception
    (including KeyboardInterrupt) saves the progress since the last checkpoint, then re-raises.
    """
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    output_dir = Path(output_dir)
    if max_steps_override is not None:
        settings = replace(settings, max_steps=max_steps_override)
    resumed_from = _last_checkpoint(output_dir) if resume else None
    if resumed_from is not None and _checkpoint_step(resumed_from) >= settings.max_steps:
        # A finished run: resuming would make the Trainer take one more step on every rerun.
        return TrainingOutcome(resumed_from, _checkpoint_step(resumed_from), [], resumed_from, False, settings.num_generations)
    dataset = prompts_dataset if isinstance(prompts_dataset, Dataset) else Dataset.from_list(list(prompts_dataset))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    rows: list[dict] = []
    stop_flag = {"stopped": False}
    trainer = GRPOTrainer(
        model=str(model_path),
        reward_funcs=[reward_fn],
        args=settings.to_grpo_config(output_dir),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=_make_callbacks(on_step, reward_fn, settings.num_generations, rows, stop_flag),
    )
    try:
        trainer.train(resume_from_checkpoint=str(resumed_from) if resumed_from else None)
    finally:
        # An early stop, a fault or a finish between save steps still leaves its last step on disk.
        if trainer.state.global_step > _checkpoint_step(_last_checkpoint(output_dir)):
            trainer._save_checkpoint(trainer.model, trial=None)
    last = _last_checkpoint(output_dir)
    return TrainingOutcome(
        checkpoint_dir=last,
        global_step=trainer.state.global_step,
        steps=rows,
        resumed_from=resumed_from,
        stopped_early=stop_flag["stopped"],
        group_size=settings.num_generations,
    )
