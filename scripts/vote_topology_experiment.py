"""Fan-out workflows with a vote on replay-mixed6-vote: does W predict the vote steps better than
their marginal, and does a vote beat the best single worker?

It builds a fresh warehouse under --workdir (the MATH level-5 test questions every replay seat
recorded), probes the six replay seats once per question (as `probe_calls` does), then records
fan-out workflows through the orchestrator: per question, for k = 0..4, `--subsets` random ordered
subsets of k replay workers, each asked the question, then the vote seat shown all of them. W and
the baselines are then fitted out of fold over questions on every row (`evaluate_aggregator_steps`)
and scored on the vote steps, once with and once without the k = 0 votes (shown nothing, a vote
abstains: trivially predictable). Last, on the eval split, the vote over the best 2, 3 and 4
workers (ranked by their train-split probe accuracy, best first, so ties go to the best) beside
the best single worker, with an exact McNemar test.

    .venv/bin/python -m scripts.vote_topology_experiment --workdir /tmp/vote_topology

It prints one JSON object (about 5 minutes on 2 busy cores; rerunning reuses the warehouse).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

import polars as pl
from scipy.stats import binomtest

from conductor_pipeline.conductor.execution import workflow_key
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.corpora.loaders import load_math_full
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.probing.runner import run_probes
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_of
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.workflow import Step, Workflow
from conductor_pipeline.world_model.aggregator_steps import AggregatorStepReport, evaluate_aggregator_steps
from conductor_pipeline.world_model.cross_validation import EvaluationSettings
from conductor_pipeline.world_model.data import load_training_frame
from conductor_pipeline.world_model.features import WorldModelSettings

POOL = "replay-mixed6-vote"
RUN_ID = "vote-topology"
VOTE_SUBTASK = "Answer with the majority of the earlier answers."
MAX_FAN_OUT = 4  # a workflow has at most five steps: four workers and the vote


def fan_out(question: Question, workers: list[str], vote: str) -> Workflow:
    """Each worker asked the question, then the vote shown every one of them."""
    steps = [Step(worker, question.problem, ()) for worker in workers]
    return Workflow((*steps, Step(vote, VOTE_SUBTASK, tuple(range(len(workers))))))


async def record_workflows(store: Warehouse, questions: list[Question], subsets: int, ranked: list[str]) -> int:
    pool = load_pool(POOL)
    workers = build_workers(pool)
    (vote,) = [seat.name for seat in pool.workers if seat.is_vote]
    solo = pool.solo_worker_names
    orchestrator = Orchestrator(pool, workers, Governor.from_pool(pool), store)
    done = set(store.query("SELECT workflow_id FROM workflows WHERE run_id = $run", {"run": RUN_ID})["workflow_id"])
    jobs = []
    for question in questions:
        rng = random.Random(question.question_id)
        plans = [("k0", [])] + [
            (f"k{k}-{i}", rng.sample(solo, k)) for k in range(1, MAX_FAN_OUT + 1) for i in range(subsets)
        ]
        if split_of(question.question_id) == "eval":
            plans += [(f"top{m}", ranked[:m]) for m in range(2, MAX_FAN_OUT + 1)]
        jobs += [(question, arm, chosen) for arm, chosen in plans]

    async def run(question: Question, arm: str, chosen: list[str]) -> None:
        workflow = fan_out(question, chosen, vote)
        await orchestrator.execute(question, workflow, run_id=RUN_ID, conductor_name="fan-out", arm=arm)

    pending = [job for job in jobs if workflow_key(RUN_ID, job[1], 0, job[0].question_id, "fan-out") not in done]
    for start in range(0, len(pending), 500):
        await asyncio.gather(*(run(*job) for job in pending[start : start + 500]))
    await orchestrator.aclose()
    return len(pending)


def report_json(report: AggregatorStepReport | None) -> dict:
    if report is None:
        return {"verdict": "no aggregator rows"}
    return {
        "verdict": report.verdict,
        "scores": {model: {m: round(e.value, 4) for m, e in ms.items()} for model, ms in report.scores.items()},
        "log_loss_w_minus": {
            c.baseline: [round(c.difference.value, 4), round(c.difference.low, 4), round(c.difference.high, 4)]
            for c in report.comparisons
            if c.metric == "log_loss"
        },
        "by_visible_steps": report.by_visible_steps.with_columns(pl.selectors.float().round(3)).to_dicts(),
    }


def vote_vs_best_single(store: Warehouse, ranked: list[str]) -> dict:
    probes = store.query("SELECT question_id, worker, correct FROM calls WHERE kind = 'probe' AND correct IS NOT NULL")
    votes = store.query(
        "SELECT question_id, arm, correct FROM workflows WHERE run_id = $run AND arm LIKE 'top%'", {"run": RUN_ID}
    )
    best = probes.filter(pl.col("worker") == ranked[0]).select("question_id", best=pl.col("correct"))
    out: dict[str, object] = {"ranking": ranked}
    for arm in sorted(set(votes["arm"])):
        paired = votes.filter(pl.col("arm") == arm).join(best, on="question_id")
        only_vote = int((paired["correct"] & ~paired["best"]).sum())
        only_best = int((~paired["correct"] & paired["best"]).sum())
        discordant = only_vote + only_best
        out[arm] = {
            "n": paired.height,
            "vote_accuracy": round(float(paired["correct"].mean()), 4),
            "best_single_accuracy": round(float(paired["best"].mean()), 4),
            "vote_only_right": only_vote,
            "best_only_right": only_best,
            "mcnemar_exact_p": binomtest(only_vote, discordant, 0.5).pvalue if discordant else 1.0,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/vote_topology"))
    parser.add_argument("--subsets", type=int, default=2, help="Random worker subsets per question and fan-out size")
    parser.add_argument("--max-questions", type=int, default=None, help="Cap on the questions (a quick check)")
    parser.add_argument("--bootstrap", type=int, default=200)
    args = parser.parse_args(argv)

    started = time.monotonic()
    store = Warehouse(args.workdir / "warehouse.duckdb")
    pool = load_pool(POOL)
    workers = build_workers(pool, pool.solo_worker_names)
    covered = set.intersection(*(set(w.question_ids) for w in workers.values()))
    questions = sorted(
        (q for q in load_math_full() if q.split == "test" and q.level == 5 and q.question_id in covered),
        key=lambda q: q.question_id,
    )[: args.max_questions]
    store.insert("questions", questions)
    asyncio.run(
        run_probes(
            store, pool, workers, questions, samples=1, temperature=0.2, run_id="probe",
            governor=Governor.from_pool(pool), only_recorded=True,
        )
    )
    train_accuracy = (
        store.query("SELECT question_id, worker, correct FROM calls WHERE kind = 'probe' AND correct IS NOT NULL")
        .filter(pl.col("question_id").map_elements(split_of, return_dtype=pl.String) == "train")
        .group_by("worker")
        .agg(pl.col("correct").mean())
        .sort("correct", "worker", descending=[True, False])
    )
    ranked = train_accuracy["worker"].to_list()
    recorded = asyncio.run(record_workflows(store, questions, args.subsets, ranked))

    seats = {seat.name: seat for seat in pool.workers}
    settings = EvaluationSettings(n_bootstrap=args.bootstrap, held_out_workers=False, model=WorldModelSettings())
    frame = load_training_frame(store)
    without_empty = frame.filter(~((pl.col("worker") == "majority-vote") & (pl.col("visible_steps") == 0)))
    result = {
        "questions": len(questions),
        "workflows_recorded_now": recorded,
        "training_rows": frame.height,
        "all_votes": report_json(evaluate_aggregator_steps(frame, seats, settings)),
        "votes_shown_1_to_4": report_json(evaluate_aggregator_steps(without_empty, seats, settings)),
        "eval_split_vote_vs_best_single": vote_vs_best_single(store, ranked),
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
