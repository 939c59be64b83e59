"""Rollouts: the GRPO prompt rows (randomised sub-pools), executing sampled workflows on the pool,
and sampling a policy outside training (the warm start's parse check, the pruning audit)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from conductor_pipeline.conductor.hf_policy import HFLocalPolicy
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.conductor.prompt import (
    Naming,
    build_conductor_prompt,
    catalogue_from_pool,
    default_examples,
    displayed_worker_names,
    rank_by_predicted_success,
)
from conductor_pipeline.conductor.protocols import BatchingPolicy, ConductorPolicy, PolicyOutput
from conductor_pipeline.conductor.recursion import DEFAULT_MAX_DEPTH
from conductor_pipeline.devices import AUTO_DEVICE
from conductor_pipeline.pools.backends.base import Worker
from conductor_pipeline.pools.config import PoolConfig
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import Question
from conductor_pipeline.training.reward import ROLLOUT_POSITION, TRAINING_STEP, RolloutVerdict, reward_for
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.training.telemetry import RolloutLog
from conductor_pipeline.workflow import PARSE_OK, parse_code

# --- prompts: the training dataset and randomised pools ------------------------------------


def conductor_prompt_rows(
    questions: Sequence[Any],
    workers: Sequence[str],
    build_messages: Callable[[Any, Sequence[str]], list[dict]],
    *,
    randomize_pools: bool = False,
    min_pool_size: int = 2,
    max_pool_size: int | None = None,
    seed: int = 0,
    question_id: Callable[[Any], str] = lambda q: q.question_id,
    must_show: Callable[[Any], Sequence[Sequence[str]]] | None = None,
    order: Callable[[Any, list[str]], list[str]] | None = None,
) -> list[dict]:
    """One GRPO dataset row per question: `prompt` (chat messages), `question_id`, `workers`.

    With `randomize_pools` (the paper), each question shows a random subset of the pool (from
    `min_pool_size` to `max_pool_size` workers, default the whole pool; order shuffled), so the
    policy learns to route over unseen pools;
    `workers` records exactly what that prompt displayed, which the reward's parser must use.
    `must_show(question)` gives groups of workers; each random subset then holds one worker of
    every (non-empty) group, e.g. (solvers, failers) so that a contested question stays contested
    in the sub-pool it is shown with (see `routing_anchors`). `order(question, shown)` then
    reorders what is shown (e.g. ranked by W's numbers), after the shuffle.
    """
    rng = random.Random(seed)
    rows = []
    for question in questions:
        shown = list(workers)
        if randomize_pools and len(shown) > min_pool_size:
            size = rng.randint(min_pool_size, min(len(shown), max_pool_size or len(shown)))
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
        if order is not None:
            shown = order(question, shown)
        rows.append(
            {"prompt": build_messages(question, shown), "question_id": question_id(question), "workers": shown}
        )
    return rows


# --- the pool's prompts ----------------------------------------------------------------------


def pool_prompt_rows(
    questions: Sequence[Question],
    pool_config: PoolConfig,
    settings: GRPOSettings,
    *,
    naming: Naming,
    n_examples: int,
    anchors: Mapping[str, tuple[list[str], list[str]]] | None = None,
    predicted_success: Mapping[str, Mapping[str, float]] | None = None,
    ranked: bool = False,
) -> list[dict]:
    """GRPO dataset rows of the pool's conductor prompts: each question with the (possibly random)
    sub-pool its prompt shows; with `anchors`, that sub-pool holds one of the question's best and
    one of its worst workers (`routing_anchors`). Seats that cannot answer alone (a vote, the
    conductor itself) are shown like any other, in some sub-pools and not others, but never without
    a seat that can answer. `predicted_success` (question id -> {seat: P(success)}) puts the world
    model's numbers next to the catalogue lines; `ranked` lists each sub-pool by them, highest first."""
    if ranked and predicted_success is None:
        raise ValueError("a ranked catalogue is ordered by W's numbers: give predicted_success")
    catalogue = {entry.name: entry for entry in catalogue_from_pool(pool_config)}
    examples = default_examples(n_examples)
    solo = pool_config.solo_worker_names
    needs_solver = len(solo) < len(pool_config.worker_names)

    def build_messages(question: Question, shown: Sequence[str]) -> list[dict]:
        return build_conductor_prompt(
            question, [catalogue[n] for n in shown], naming=naming, examples=examples,
            predicted_success=predicted_success.get(question.question_id) if predicted_success else None,
        )

    def must_show(question: Question) -> Sequence[Sequence[str]]:
        groups = anchors.get(question.question_id, ()) if anchors else ()
        return groups or ((solo,) if needs_solver else ())

    def by_predicted_success(question: Question, shown: list[str]) -> list[str]:
        return rank_by_predicted_success(shown, predicted_success.get(question.question_id, {}))  # type: ignore[union-attr]

    return conductor_prompt_rows(
        questions,
        pool_config.worker_names,
        build_messages,
        randomize_pools=settings.randomize_pools,
        min_pool_size=settings.min_pool_size,
        max_pool_size=settings.max_pool_size,
        seed=settings.seed,
        must_show=must_show if anchors or needs_solver else None,
        order=by_predicted_success if ranked else None,
    )


# --- executing rollouts on the pool ----------------------------------------------------------

# Run id and conductor name of rollouts executed without a log (nothing reaches the warehouse).
UNRECORDED = "unrecorded"


class PoolExecutor:
    """The reward's `execute`: parse a rollout against the sub-pool its prompt showed, run it, grade it.

    With a `log` (a `RolloutLog`) every rollout is recorded like an evaluation workflow (its
    `workflows` row and the `calls` of the conductor and of each executed step), tagged with the
    log's phase, the optimizer step and its position in the step's batch; `flush` hands what the
    orchestrators buffered to the log's `RowBuffer`, `write_rows` writes it. Without a log nothing is
    recorded. Each verdict is also kept in memory per question (`observed`) for the pruning audit.

    Orchestrators and governors are built per event loop: asyncio primitives bind to the loop that
    first waits on them, and TRL awaits async rewards on its own loop thread.

    A pool that seats the conductor needs `conductor_policy`: it answers a rollout's conductor
    steps (recursion, up to `max_depth` levels), sampled like the rollouts (`temperature`, at most
    `max_new_tokens`). In GRPO that is a frozen copy of the policy the run started from
    (`frozen_conductor`): the policy being trained lives inside the trainer.
    """

    def __init__(
        self,
        pool_config: PoolConfig,
        workers: Mapping[str, Worker],
        questions: Sequence[Question],
        naming: str,
        predict_success: Callable[[Question], dict[str, float]] | None = None,
        log: RolloutLog | None = None,
        *,
        conductor_policy: ConductorPolicy | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
        temperature: float = 1.0,
        max_new_tokens: int = 1024,
    ):
        self.pool = pool_config
        self.workers = dict(workers)
        self.questions = {q.question_id: q for q in questions}
        self.naming = naming
        # W's P(success) per worker, for the reward bonus; computed once per question.
        self.predict_success = predict_success
        self.log = log
        self.conductor_policy = conductor_policy
        self.max_depth = max_depth
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self._predicted: dict[str, dict[str, float]] = {}
        self._aggregators = frozenset(seat.name for seat in pool_config.workers if seat.is_vote)
        self._orchestrators: dict[tuple[int, int, int], Orchestrator] = {}
        self._governors: dict[int, Governor] = {}
        self.observed: dict[str, list[RolloutVerdict]] = {}

    def _orchestrator(self) -> Orchestrator:
        """The orchestrator of this event loop, of the log's writer and of the conductor policy (one
        governor per loop)."""
        loop_id = id(asyncio.get_running_loop())
        writer = self.log.buffer if self.log is not None else None
        key = (loop_id, id(writer), id(self.conductor_policy))
        if key not in self._orchestrators:
            governor = self._governors.setdefault(loop_id, Governor.from_pool(self.pool))
            self._orchestrators[key] = Orchestrator(
                self.pool, self.workers, governor, writer, naming=self.naming, max_depth=self.max_depth,
                conductor_policy=self.conductor_policy, conductor_temperature=self.temperature,
                conductor_max_new_tokens=self.max_new_tokens,
            )
        return self._orchestrators[key]

    async def __call__(self, completion: str | PolicyOutput, row: dict) -> RolloutVerdict:
        """One rollout: `completion` is its text, or the policy's output with its token counts."""
        output = completion if isinstance(completion, PolicyOutput) else rollout_output(completion, row)
        question = self.questions[row["question_id"]]
        orchestrator = self._orchestrator()
        if self.log is None:  # nothing is recorded: the ids only name the workflow in memory
            record = await orchestrator.run_workflow_text(
                question, output.text, conductor_name=UNRECORDED, run_id=UNRECORDED, shown_workers=row["workers"]
            )
        else:
            tag = self.log.tag(row.get(TRAINING_STEP), int(row.get(ROLLOUT_POSITION, 0)))
            record = await orchestrator.run_workflow_text(
                question, output.text, conductor_name=self.log.conductor, run_id=self.log.run_id,
                shown_workers=row["workers"], rollout=tag, conductor_output=output,
                workflow_id=self.log.workflow_id(tag, question.question_id),
            )
        parsed = record.parse_code == PARSE_OK
        final_worker = record.workers[-1] if parsed else None
        verdict = RolloutVerdict(
            record.parse_code, record.correct if parsed else None, cost_usd=record.cost_usd or 0.0,
            expected_success=self._expected(question, final_worker), final_worker=final_worker,
            fans_out=self._fans_out(orchestrator, output.text, row["workers"]) if parsed and self._aggregators else None,
        )
        self.observed.setdefault(row["question_id"], []).append(verdict)
        return verdict

    async def flush(self) -> None:
        """Hand the orchestrators' rows to the log's buffer (at the end of each reward call)."""
        for orchestrator in list(self._orchestrators.values()):
            await orchestrator.flush()

    def write_rows(self) -> None:
        """Write every held row to the warehouse (before a checkpoint, at the end of a run, before reading back)."""
        if self.log is not None:
            self.log.buffer.flush()

    def _fans_out(self, orchestrator: Orchestrator, text: str, shown: Sequence[str]) -> bool:
        """Whether a parsed workflow's final step is a vote seat that saw at least two results."""
        final = orchestrator.parse(text, shown_workers=shown).steps[-1]
        return final.worker in self._aggregators and len(final.sees) >= 2

    def _expected(self, question: Question, worker: str | None) -> float | None:
        if self.predict_success is None or worker is None:
            return None
        if question.question_id not in self._predicted:
            self._predicted[question.question_id] = self.predict_success(question)
        return self._predicted[question.question_id].get(worker)  # None for a conductor seat

    def observed_rewards(self, variant: str) -> dict[str, list[float]]:
        """Question id -> the scored rewards of its rollouts so far (infrastructure failures left out)."""
        rewards = {qid: [reward_for(v, variant) for v in verdicts] for qid, verdicts in self.observed.items()}
        return {qid: [r for r in values if r is not None] for qid, values in rewards.items()}


def rollout_output(text: str, row: Mapping[str, Any]) -> PolicyOutput:
    """A trainer's sampled completion as a policy output: its token count when the trainer passed
    the completion ids; the sampling time is not known per completion (one batch made them all)."""
    ids = row.get("completion_ids")
    return PolicyOutput(text=text, prompt_tokens=None, completion_tokens=len(ids) if ids is not None else None, latency_s=None)


# --- sampling the policy without training ----------------------------------------------------


def frozen_conductor(pool_config: PoolConfig, model_path: Path | str, device: str = AUTO_DEVICE) -> HFLocalPolicy | None:
    """The policy that answers a training rollout's conductor steps: the model the run started
    from, frozen, on `device`; None when the pool seats no conductor. It loads on its first
    recursive step, so a pool that seats the conductor costs a second copy of the policy in memory
    only once a rollout delegates to it."""
    if not any(seat.is_conductor for seat in pool_config.workers):
        return None
    return HFLocalPolicy(model_path, device=device, name=f"frozen:{Path(str(model_path)).name}")


async def sample_completions(
    policy: ConductorPolicy, rows: Sequence[dict], samples: int, max_new_tokens: int
) -> list[tuple[dict, PolicyOutput]]:
    """`samples` completions per row at temperature 1 (the rollout temperature). A batching policy
    samples every row's completions in one call, each completion from a seed of its own; any other
    policy is called once per row, seeded per row."""
    if isinstance(policy, BatchingPolicy):
        repeated = [row for row in rows for _ in range(samples)]
        sampled = await policy.propose_batch(
            [row["prompt"] for row in repeated], temperature=1.0, max_new_tokens=max_new_tokens,
            seeds=range(len(repeated)),
        )
        return list(zip(repeated, sampled, strict=True))
    outputs: list[tuple[dict, PolicyOutput]] = []
    for index, row in enumerate(rows):
        sampled = await policy.propose(row["prompt"], n=samples, temperature=1.0, max_new_tokens=max_new_tokens, seed=index)
        outputs += [(row, out) for out in sampled]
    return outputs


async def execute_samples(executor: PoolExecutor, sampled: Sequence[tuple[dict, PolicyOutput]]) -> list[RolloutVerdict]:
    """Run sampled completions through the executor (position = order sampled), then queue their rows."""
    verdicts = [await executor(output, {**row, ROLLOUT_POSITION: position}) for position, (row, output) in enumerate(sampled)]
    await executor.flush()
    return verdicts


def parse_check(
    model_path: Path | str,
    rows: Sequence[dict],
    naming: Naming,
    max_new_tokens: int,
    samples: int,
    executor: PoolExecutor | None = None,
    *,
    device: str = AUTO_DEVICE,
) -> tuple[float, dict[str, int]]:
    """(share of sampled completions that parse, count per parse code) at temperature 1, each
    completion parsed against the workers its prompt showed; the policy runs on `device`. With an
    `executor`, every sample is also executed on the pool and recorded under the executor's log;
    the checked policy itself answers any conductor step (recursion)."""
    policy = HFLocalPolicy(model_path, device=device)

    async def check() -> list[str]:
        try:
            sampled = await sample_completions(policy, rows, samples, max_new_tokens)
            if executor is None:
                return [parse_code(out.text, displayed_worker_names(row["workers"], naming)) for row, out in sampled]
            return [verdict.parse_code for verdict in await execute_samples(executor, sampled)]
        finally:
            await policy.aclose()

    if executor is None:
        codes = Counter(asyncio.run(check()))
    else:
        previous, executor.conductor_policy = executor.conductor_policy, policy
        try:
            codes = Counter(asyncio.run(check()))
        finally:
            executor.conductor_policy = previous
        executor.write_rows()
    total = sum(codes.values())
    return (codes[PARSE_OK] / total if total else 0.0), dict(codes.most_common())
