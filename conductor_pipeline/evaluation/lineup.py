"""The arms of one evaluation run, built once: their names key the run and the same objects run.

Adding an arm is one object in `eval_lineup` (a Router class with a `name` and a `route`, wrapped
in a RouterArm, or any other Arm): its name then reaches the run id, the `eval_arms` metadata and
the tables with no second list to keep in step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import polars as pl

from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.evaluation.arms import Arm, ConductorArm, OracleArm, RouterArm, SoloArm, VoteArm, run_arm
from conductor_pipeline.evaluation.cascades import CascadeArm, CascadeChoice, choose_cascades
from conductor_pipeline.evaluation.routers import (
    BestSingleChoice,
    BestSingleRouter,
    RandomRouter,
    SuccessAndCostModel,
    WCascadeRouter,
    WorldModelRouter,
    solo_verdicts,
)
from conductor_pipeline.evaluation.slices import EVAL_RUN_PREFIX, SliceSpec
from conductor_pipeline.pools.backends.base import Worker
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import Question, stable_id
from conductor_pipeline.warehouse import Warehouse


@dataclass(frozen=True)
class ArmLineup:
    """Every arm of a run, grouped by when it runs; `arms` and `names` keep the run-id order."""

    solo: tuple[SoloArm, ...]
    # After the solo arms (the oracle routes on their verdicts), concurrently: routers and votes.
    routers: tuple[Arm, ...]
    # Last and one at a time: a local policy holds the machine while it generates.
    conductors: tuple[ConductorArm, ...] = ()

    @property
    def arms(self) -> tuple[Arm, ...]:
        return (*self.solo, *self.routers, *self.conductors)

    @property
    def names(self) -> list[str]:
        return [arm.name for arm in self.arms]


def eval_lineup(
    seats: Sequence[WorkerSeat],
    calibration: BestSingleChoice,
    *,
    random_seed: int = 0,
    world_model: SuccessAndCostModel | None = None,
    lambda_cost: float = 0.0,
    conductors: Sequence[ConductorArm] = (),
    cascade_model: SuccessAndCostModel | None = None,
    cascade_threshold: float = 0.5,
    vote_top_k: Sequence[int] | None = None,
    agreement_cascades: Sequence[CascadeArm] = (),
) -> ArmLineup:
    """Each seated worker solo; best single, random and oracle routers; the W-router when a
    (train-split) world model is given and the W-cascade when `cascade_model` is; with
    `vote_top_k`, broadcast-and-vote over every worker and over the best k (train split) for each
    k between 2 and the pool size; the agreement cascades (`cascades.choose_cascades`); then the
    conductors."""
    workers = tuple(seat.name for seat in seats)
    routers: list[Arm] = [
        RouterArm(BestSingleRouter(calibration)),
        RouterArm(RandomRouter(workers, seed=random_seed)),
        OracleArm(fallback=calibration.worker),
    ]
    if world_model is not None:
        routers.append(RouterArm(WorldModelRouter(world_model, tuple(seats), lambda_cost=lambda_cost)))
    if cascade_model is not None:
        cascade = WCascadeRouter(cascade_model, tuple(seats), fallback=calibration.worker, threshold=cascade_threshold)
        routers.append(RouterArm(cascade))
    if vote_top_k is not None:
        routers.extend(vote_arms(ranked_workers(calibration, workers), vote_top_k))
    routers.extend(agreement_cascades)
    return ArmLineup(tuple(SoloArm(worker) for worker in workers), tuple(routers), tuple(conductors))


def ranked_workers(calibration: BestSingleChoice, workers: Sequence[str]) -> list[str]:
    """`workers` best first by train-split accuracy (ties: name); workers it did not rate come last."""
    rated = [w for w in calibration.accuracies if w in workers]
    return rated + [w for w in workers if w not in rated]


def cascade_vote(ranked: Sequence[str], top_k: Sequence[int]) -> VoteArm:
    """The largest best-k vote that `vote_arms` runs (the vote over all when it runs none): the vote
    a cascade is built from and compared with."""
    k = max((k for k in top_k if 2 <= k < len(ranked)), default=None)
    return VoteArm(f"top{k}", tuple(ranked[:k])) if k is not None else VoteArm("all", tuple(ranked))


def train_split_cascades(
    store: Warehouse,
    pool: str,
    calibration: BestSingleChoice,
    workers: Sequence[str],
    top_k: Sequence[int],
    population: Collection[str],
) -> list[CascadeChoice]:
    """The agreement cascades over the largest best-k vote of `workers`, chosen on the pool's probe
    answers to the train-split questions of the eval's `population` (its corpus and levels: how
    often workers agree differs between GSM8K and MATH level 5); none for fewer than three workers."""
    if len(workers) < 3:
        return []
    vote = cascade_vote(ranked_workers(calibration, workers), top_k)
    answers = store.query_file("probe_answers", {"pool": pool})
    return choose_cascades(answers.filter(pl.col("question_id").is_in(list(population))), vote)


def vote_arms(ranked: Sequence[str], top_k: Sequence[int]) -> list[VoteArm]:
    """A vote over every worker, and over the best k for each k that is neither one worker (that
    is the best single worker) nor every worker (that is the first vote)."""
    if len(ranked) < 2:
        return []
    arms = [VoteArm("all", tuple(ranked))]
    arms += [VoteArm(f"top{k}", tuple(ranked[:k])) for k in sorted(set(top_k)) if 2 <= k < len(ranked)]
    return arms


class ConductorTwins(NamedTuple):
    """Which conductor arms `eval_tables` pairs: what GRPO changed, and what the catalogue's order does."""

    started_from: dict[str, str]  # a trained arm -> its warm start's arm, in the same catalogue order
    order_twins: dict[str, str]  # a pool-order arm -> the same policy's arm with the catalogue shuffled


def conductor_twins(
    arm_names: Mapping[tuple[str, str], str], *, trained: str | None, warm_start: str | None
) -> ConductorTwins:
    """Pairs of conductor arms keyed `(policy label, catalogue order)` -> arm name, where the
    order is "pool" or "shuffled": each arm of the `trained` label with the `warm_start` label's
    arm in the same order (none unless both were evaluated), and each pool-order arm with its
    shuffled twin."""
    started_from = {
        name: arm_names[(warm_start, order)]
        for (label, order), name in arm_names.items()
        if trained is not None and label == trained and (warm_start, order) in arm_names
    }
    order_twins = {
        name: arm_names[(label, "shuffled")]
        for (label, order), name in arm_names.items()
        if order == "pool" and (label, "shuffled") in arm_names
    }
    return ConductorTwins(started_from, order_twins)


def eval_run_id(
    *,
    pool: str,
    spec: SliceSpec,
    repeats: int,
    split_fingerprint: str,
    include_question: bool,
    max_depth: int,
    arm_names: Sequence[str],
    random_seed: int,
    w_router_lambda_cost: float,
    arm_inputs: str | None = None,
) -> str:
    """The run id: a hash of everything that decides which workflows a run records, so a rerun
    with the same settings resumes the same run and any other setting starts a new one.
    `arm_inputs` fingerprints what the arms are made of beyond their names (the pool's seats,
    the best single worker, the routing world model, each conductor's weights and prompt)."""
    parts: list[object] = [
        pool, spec.corpus, list(spec.splits), list(spec.math_levels), spec.size, spec.order, repeats, split_fingerprint,
        include_question, max_depth, list(arm_names), random_seed, w_router_lambda_cost,
    ]
    # A slice not restricted to the recorded questions is another slice: another run. Added only then,
    # so the ids of every run recorded with the default stay what they were.
    unrestricted = [] if spec.only_recorded else ["all questions, recorded or not"]
    return EVAL_RUN_PREFIX + stable_id(*parts, *([arm_inputs] if arm_inputs is not None else []), *unrestricted)


async def run_lineup(
    store: Warehouse,
    pool_config: PoolConfig,
    workers: Mapping[str, Worker],
    questions: Sequence[Question],
    *,
    run_id: str,
    lineup: ArmLineup,
    repeats: int = 1,
    include_question: bool = True,
    max_depth: int = 2,
    log: Callable[[str], object] = lambda message: None,
) -> None:
    """Every arm of the lineup on the questions, recorded under `run_id`. Workflows already
    recorded under it are skipped, so a rerun after a crash continues, except those that ended in
    an infrastructure failure: they are deleted first (`retry_infra_failures`) and run again.
    Closes the workers and the conductors' policies when done.

    A pool that seats the conductor recurses: each conductor arm's workflows call that arm's own
    policy, with its settings, at the conductor's seat (the arm must be `recursive`).
    """
    seats_conductor = any(seat.is_conductor for seat in pool_config.workers)
    mislabelled = [arm.name for arm in lineup.conductors if arm.recursive != seats_conductor]
    if mislabelled:
        raise ValueError(
            f"conductor arms {mislabelled} are labelled recursive={not seats_conductor} but pool "
            f"{pool_config.name!r} {'seats' if seats_conductor else 'does not seat'} the conductor"
        )
    governor = Governor.from_pool(pool_config)

    def orchestrator_for(arm: ConductorArm | None) -> Orchestrator:
        # The other arms never reach the conductor's seat: they run on the pool without it.
        pool = pool_config if arm is not None else pool_config.model_copy(
            update={"workers": [seat for seat in pool_config.workers if not seat.is_conductor]}
        )
        return Orchestrator(
            pool, workers, governor, store, include_question=include_question, max_depth=max_depth,
            naming=arm.naming if arm else "ordinal",
            conductor_policy=arm.policy if arm and seats_conductor else None,
            conductor_temperature=arm.temperature if arm else 1.0,
            conductor_max_new_tokens=arm.max_new_tokens if arm else 1024,
            predicted_success=arm.predicted_success if arm else None,
        )

    retried = retry_infra_failures(store, run_id)
    if retried:
        log(f"{retried} workflows of {run_id} ended in an infrastructure failure: running them again")
    done = frozenset(store.query_file("eval_workflows", {"run_id": run_id})["workflow_id"].to_list())
    baseline = orchestrator_for(None)

    async def run(arm: Arm, orchestrator: Orchestrator) -> None:
        records = await run_arm(orchestrator, arm, questions, run_id=run_id, repeats=repeats, skip_workflow_ids=done)
        log(f"{arm.name}: {len(records)} workflows run ({len(questions)} questions x {repeats})")

    try:
        await asyncio.gather(*(run(arm, baseline) for arm in lineup.solo))
        verdicts = _solo_verdicts(store, run_id, lineup.solo)
        routers = [arm.with_solo_verdicts(verdicts) if isinstance(arm, OracleArm) else arm for arm in lineup.routers]
        await asyncio.gather(*(run(arm, baseline) for arm in routers))
        for arm in lineup.conductors:
            orchestrator = orchestrator_for(arm)
            try:
                await run(arm, orchestrator)
            finally:
                await orchestrator.aclose()
    finally:
        await baseline.aclose()
        for arm in lineup.conductors:
            await arm.policy.aclose()
        for worker in workers.values():
            await worker.aclose()


def retry_infra_failures(store: Warehouse, run_id: str) -> int:
    """Delete the run's top-level workflows that ended in an infrastructure failure, with their
    calls and the workflows nested in them, so the run executes them again; returns how many
    top-level workflows were deleted. Completed workflows (scored, right or wrong) stay."""
    deleted = store.execute_files(
        ["delete_infra_failed_calls", "delete_infra_failed_workflows"], {"run_id": run_id}
    )
    return sum(1 for (top_level,) in deleted if top_level)


def _solo_verdicts(store: Warehouse, run_id: str, solo: Sequence[SoloArm]) -> dict[str, dict[str, bool]]:
    """{question: {worker: solved}} from every solo workflow recorded under the run (this call's
    and any earlier attempt's)."""
    rows = store.query_file("eval_workflows", {"run_id": run_id}).filter(pl.col("arm").is_in([a.name for a in solo]))
    verdict_rows = rows.select("question_id", pl.col("workers").list.first().alias("worker"), "correct")
    return solo_verdicts(verdict_rows.iter_rows(named=True))
