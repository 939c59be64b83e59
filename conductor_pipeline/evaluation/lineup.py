"""The arms of one evaluation run, built once: their names key the run and the same objects run.

Adding an arm is one object in `eval_lineup` (a Router class with a `name` and a `route`, wrapped
in a RouterArm, or any other Arm): its name then reaches the run id, the `eval_arms` metadata and
the tables with no second list to keep in step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.evaluation.arms import Arm, ConductorArm, OracleArm, RouterArm, SoloArm, run_arm
from conductor_pipeline.evaluation.routers import (
    BestSingleChoice,
    BestSingleRouter,
    RandomRouter,
    SuccessAndCostModel,
    WorldModelRouter,
    solo_verdicts,
)
from conductor_pipeline.evaluation.slices import EVAL_RUN_PREFIX
from conductor_pipeline.pools.backends.base import Worker
from conductor_pipeline.pools.config import PoolConfig, WorkerSeat
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import Question, stable_id
from conductor_pipeline.warehouse import Warehouse


@dataclass(frozen=True)
class ArmLineup:
    """Every arm of a run, grouped by when it runs; `arms` and `names` keep the run-id order."""

    solo: tuple[SoloArm, ...]
    # After the solo arms (the oracle routes on their verdicts), concurrently.
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
) -> ArmLineup:
    """Each seated worker solo; best single, random and oracle routers; the W-router when a
    (train-split) world model is given; then the conductors."""
    workers = tuple(seat.name for seat in seats)
    routers: list[Arm] = [
        RouterArm(BestSingleRouter(calibration)),
        RouterArm(RandomRouter(workers, seed=random_seed)),
        OracleArm(fallback=calibration.worker),
    ]
    if world_model is not None:
        routers.append(RouterArm(WorldModelRouter(world_model, tuple(seats), lambda_cost=lambda_cost)))
    return ArmLineup(tuple(SoloArm(worker) for worker in workers), tuple(routers), tuple(conductors))


def eval_run_id(
    *,
    pool: str,
    corpus: str,
    splits: Sequence[str],
    math_levels: Sequence[int],
    slice_size: int,
    order: str,
    repeats: int,
    split_fingerprint: str,
    include_question: bool,
    max_depth: int,
    arm_names: Sequence[str],
    random_seed: int,
    w_router_lambda_cost: float,
) -> str:
    """The run id: a hash of everything that decides which workflows a run records, so a rerun
    with the same settings resumes the same run and any other setting starts a new one."""
    return EVAL_RUN_PREFIX + stable_id(
        pool, corpus, list(splits), list(math_levels), slice_size, order, repeats, split_fingerprint,
        include_question, max_depth, list(arm_names), random_seed, w_router_lambda_cost,
    )


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
    """Every arm of the lineup on the questions, recorded under `run_id`; workflows already
    recorded under it are skipped, so a rerun after a crash continues. Closes the workers and
    the conductors' policies when done.

    A pool that seats the conductor recurses with the first conductor arm's policy and settings.
    """
    recursion = lineup.conductors[0] if lineup.conductors else None
    orchestrator = Orchestrator(
        pool_config, workers, Governor.from_pool(pool_config), store,
        include_question=include_question, max_depth=max_depth,
        naming=recursion.naming if recursion else "ordinal",
        conductor_policy=recursion.policy if recursion else None,
        conductor_temperature=recursion.temperature if recursion else 1.0,
        conductor_max_new_tokens=recursion.max_new_tokens if recursion else 1024,
        predicted_success=recursion.predicted_success if recursion else None,
    )
    done = frozenset(store.query_file("eval_workflows", {"run_id": run_id})["workflow_id"].to_list())

    async def run(arm: Arm) -> None:
        records = await run_arm(orchestrator, arm, questions, run_id=run_id, repeats=repeats, skip_workflow_ids=done)
        log(f"{arm.name}: {len(records)} workflows run ({len(questions)} questions x {repeats})")

    try:
        await asyncio.gather(*(run(arm) for arm in lineup.solo))
        verdicts = _solo_verdicts(store, run_id, lineup.solo)
        routers = [arm.with_solo_verdicts(verdicts) if isinstance(arm, OracleArm) else arm for arm in lineup.routers]
        await asyncio.gather(*(run(arm) for arm in routers))
        for arm in lineup.conductors:
            await run(arm)
    finally:
        await orchestrator.aclose()
        for arm in lineup.conductors:
            await arm.policy.aclose()
        for worker in workers.values():
            await worker.aclose()


def _solo_verdicts(store: Warehouse, run_id: str, solo: Sequence[SoloArm]) -> dict[str, dict[str, bool]]:
    """{question: {worker: solved}} from every solo workflow recorded under the run (this call's
    and any earlier attempt's)."""
    rows = store.query_file("eval_workflows", {"run_id": run_id}).filter(pl.col("arm").is_in([a.name for a in solo]))
    verdict_rows = rows.select("question_id", pl.col("workers").list.first().alias("worker"), "correct")
    return solo_verdicts(verdict_rows.iter_rows(named=True))
