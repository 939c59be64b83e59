"""Could a fixed workflow in the conductor's own format meet the adaptive recipe's target?

    .venv/bin/python -m benchmarks.fixed_fan_outs --pool POOL [--home DAGSTER_HOME] [--show N]

On a pool with a vote seat, a conductor's fan-out is three or four solvers and the vote (the
five-step cap leaves four). This replays every ordered fan-out from the pool's probe answers by the
vote seat's rule (when the first `stop_when_first_agree` answers agree, the vote answers with them;
otherwise every solver runs and the majority answers, ties to the earliest; a seat without the rule
always runs every solver), keeps the train split's cost-accuracy frontier, and scores its most
accurate `--show` members on the latest eval of POOL (the instance in `--home`, default
$DAGSTER_HOME): accuracy and cost per question, paired with `vote:top5` and the best single worker
on the same questions. The choice is made on the train split only, as the static cascades' is;
the eval slice is where it is measured, never where it is chosen.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl

from benchmarks.paper_budget_report import latest_eval
from conductor_pipeline.evaluation.cascades import (
    AgreementCascade,
    ReplayedOutcome,
    agreement_table,
    answers_by_question,
    replay_cascade,
)
from conductor_pipeline.evaluation.comparisons import aligned_scores, question_scores
from conductor_pipeline.evaluation.learning import VOTE_BASELINE
from conductor_pipeline.evaluation.vote import majority_index
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.splits import train_split_rows
from conductor_pipeline.stats import compare_paired
from conductor_pipeline.workflow import DEFAULT_MAX_STEPS

BEST_SINGLE = "best_single"
Answers = Mapping[str, tuple[str | None, bool, float]]


def replay_fan_out(order: Sequence[str], quorum: int | None, answers: Answers, equivalent) -> ReplayedOutcome:
    """A fan-out to `order` and the vote, on one question's recorded answers, by the vote seat's rule."""
    if quorum is not None and quorum < len(order):
        return replay_cascade(AgreementCascade(tuple(order[:quorum]), tuple(order[quorum:]), quorum), answers, equivalent)
    answering = order[majority_index([answers[w][0] for w in order], equivalent)]
    return ReplayedOutcome(answers[answering][1], sum(answers[w][2] for w in order), len(order))


def frontier(scored: list[tuple[float, float, tuple[str, ...]]]) -> list[tuple[float, float, tuple[str, ...]]]:
    """(accuracy, cost, order) rows no cheaper row matches in accuracy, cheapest first."""
    kept: list[tuple[float, float, tuple[str, ...]]] = []
    for accuracy, cost, order in sorted(scored, key=lambda row: (row[1], -row[0])):
        if not kept or accuracy > kept[-1][0]:
            kept.append((accuracy, cost, order))
    return kept


def report(pool_name: str, instance: dg.DagsterInstance, show: int) -> str:
    pool = load_pool(pool_name)
    votes = [seat for seat in pool.workers if seat.is_vote]
    if not votes:
        raise SystemExit(f"{pool_name} has no vote seat: a conductor there writes no fan-out")
    quorum = votes[0].stop_when_first_agree
    solvers = sorted(pool.solo_worker_names)
    record, _, warehouse = latest_eval(pool_name, instance)
    run_id = record["eval_run_id"]
    probe = warehouse.query_file("probe_answers", {"pool": pool_name})
    workflows = warehouse.query_file("eval_workflows", {"run_id": run_id})
    eval_questions = set(workflows["question_id"].to_list())
    train = answers_by_question(train_split_rows(probe, solvers), solvers)
    evals = answers_by_question(probe.filter(pl.col("question_id").is_in(list(eval_questions))), solvers)
    same_train, same_eval = agreement_table(list(train.values()), solvers), agreement_table(list(evals.values()), solvers)

    orders = [o for k in range(3, DEFAULT_MAX_STEPS) for o in itertools.permutations(solvers, k)]
    scored = []
    for order in orders:
        outcomes = [replay_fan_out(order, quorum, a, same_train) for a in train.values()]
        scored.append((float(np.mean([o.correct for o in outcomes])), float(np.mean([o.cost_usd for o in outcomes])), order))
    kept = frontier(scored)[-show:]

    scores = question_scores(workflows)
    references = {arm: aligned_scores(scores, [arm]) for arm in (VOTE_BASELINE, BEST_SINGLE)}
    vote_cost = float(workflows.filter(pl.col("arm") == VOTE_BASELINE)["cost_usd"].mean())
    rule = f"stops when the first {quorum} agree" if quorum else "always runs every solver"
    lines = [
        f"### Fixed fan-outs on {pool_name} (vote seat `{votes[0].name}`, {rule})",
        "",
        (f"Chosen on {len(train)} train-split questions' probe answers ({len(orders)} ordered fan-outs of 3 to "
         f"{DEFAULT_MAX_STEPS - 1} solvers); measured on eval run `{run_id}` ({len(evals)} questions), paired."),
        "",
        ("| fan-out, in order | train accuracy | eval accuracy | eval cost vs `vote:top5` "
         "| against `vote:top5` (pts) [95% CI] | against the best single (pts) [95% CI] |"),
        "|---|---:|---:|---:|---|---|",
    ]
    for train_accuracy, _, order in reversed(kept):
        outcomes = {q: replay_fan_out(order, quorum, a, same_eval) for q, a in evals.items()}
        cells = []
        for arm in (VOTE_BASELINE, BEST_SINGLE):
            questions, (reference,) = references[arm]
            mine = np.array([float(outcomes[q].correct) for q in questions])
            c = compare_paired(mine, reference)
            cells.append(f"{100 * c.difference.value:+.1f} [{100 * c.difference.low:+.1f}, {100 * c.difference.high:+.1f}]")
        accuracy = np.mean([o.correct for o in outcomes.values()])
        cost = np.mean([o.cost_usd for o in outcomes.values()])
        lines.append(f"| {' -> '.join(order)} | {train_accuracy:.3f} | {accuracy:.3f} | {cost / vote_cost:.0%} | "
                     f"{cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--home", type=Path, help="the runs' DAGSTER_HOME (default $DAGSTER_HOME)")
    parser.add_argument("--show", type=int, default=6, help="the most accurate N of the train frontier to measure")
    args = parser.parse_args(argv)
    instance = dg.DagsterInstance.from_config(str(args.home)) if args.home else dg.DagsterInstance.get()
    with instance:
        print(report(args.pool, instance, args.show))
    return 0


if __name__ == "__main__":
    sys.exit(main())
