"""The learnability ladder: rungs of the routing problem with optima known from the recordings,
each trained by the project's own path (warm start, GRPO probe and gate, GRPO on replay with the
real reward), to find where the CPU conductor stops learning and why.

    .venv/bin/python -m benchmarks.learnability [--rungs R1 R3] [--steps 150] [--group 8] [--questions 2]
    .venv/bin/python -m benchmarks.learnability --rungs R5n --vote-payoff 2 4 6   # trains nothing

Rungs (`RUNGS`): R1 one catalogue in the pool file's order (the policy need only learn a constant),
R2 shuffled sub-pools with workers by name (the CPU default), R3 shuffled sub-pools with ordinal
names (the paper's setting), R4 R3 with W's out-of-fold P(success) next to each worker, R5 the vote
pool with ordinal names and R5n by name (fan out and aggregate). Per rung it reports, on the rung's own training prompts:

- the best static policy's expected reward (every preference order over single workers, and the
  vote over the best k shown workers where a vote is shown), computed from the recorded answers;
- the warm start's and the trained policy's reward on a fixed set of those prompts (sampled at the
  training temperature, executed and graded like rollouts), paired per prompt, and the trained
  policy's reward per GRPO step;
- where their steps went, by worker and by catalogue position, early and late in training;
- how many rollouts it took to close half of the gap between the warm start and the static optimum.

`--vote-payoff` trains nothing: on a vote-pool rung it prints what fanning out is worth on the
training prompts (the best static single-worker policy against the best vote, by the smallest
sub-pool a prompt shows), and each worker's and vote's accuracy on the training questions.

It reads a finished default run (`make run`: the warehouse and its probes under the artifacts
root), works on a copy under --workdir, and prints one markdown table and a JSON record per rung.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from conductor_pipeline.paths import ARTIFACTS_ENV, artifacts_root
from conductor_pipeline.reproducibility import DEFAULT_TORCH_THREADS, make_reproducible

DEFAULT_WORKDIR = Path("/tmp/learnability")
# Prompts and samples of the fixed evaluation of the warm start and the trained policy.
EVAL_PROMPTS = 64
EVAL_SAMPLES = 8


@dataclass(frozen=True)
class Rung:
    name: str
    what: str
    pool: str = "replay-mixed6"
    trainer: Mapping[str, object] = field(default_factory=dict)


# R1 to R5n show an unranked catalogue, sampled without constraints: the CPU profile's prompt before
# the ranked catalogue became its default (R6).
UNRANKED = {"show_predicted_success": False, "ranked_catalogue": False, "constrained_decoding": False}
RUNGS = {
    rung.name: rung
    for rung in (
        Rung("R1", "one catalogue in pool-file order, no sub-pools (learn a constant)",
             trainer={**UNRANKED, "randomize_pools": False, "naming": "ordinal"}),
        Rung("R2", "shuffled sub-pools, workers shown by name", trainer={**UNRANKED, "naming": "names"}),
        Rung("R3", "shuffled sub-pools, ordinal names with descriptions (the paper's)",
             trainer={**UNRANKED, "naming": "ordinal"}),
        Rung("R4", "R3 with W's out-of-fold P(success) next to each worker",
             trainer={**UNRANKED, "naming": "ordinal", "show_predicted_success": True}),
        Rung("R5", "the vote pool, ordinal names: fan out and aggregate", pool="replay-mixed6-vote",
             trainer={**UNRANKED, "naming": "ordinal"}),
        Rung("R5n", "the vote pool by name", pool="replay-mixed6-vote", trainer={**UNRANKED, "naming": "names"}),
        Rung("R6", "R4 with the catalogue ranked by W's numbers, constrained decoding (the CPU default)"),
    )
}


# ---------------------------------------------------------------------------- static policies


def static_optimum(
    rows: Sequence[Mapping], answers: Mapping[tuple[str, str], tuple[str | None, bool]], ranked: Sequence[str],
    aggregators: Sequence[str], variant: str,
) -> dict[str, object]:
    """The best static policy's expected reward on `rows` (each a prompt: question and the workers
    it showed): every preference order over the solo workers (route to the first one shown), and
    the vote over the best k shown workers (by `ranked`, train-split accuracy) where a vote is shown."""
    from conductor_pipeline.evaluation.vote import majority_index
    from conductor_pipeline.training.reward import REWARD_TABLE

    unparseable, wrong, right = REWARD_TABLE[variant]
    solo = [w for w in ranked if w not in aggregators]

    def reward(correct: bool) -> float:
        return right if correct else wrong

    by_order = {}
    for order in itertools.permutations(solo):
        total = 0.0
        for row in rows:
            shown = [w for w in order if w in row["workers"]]
            total += reward(answers[(row["question_id"], shown[0])][1]) if shown else unparseable
        by_order[order] = total / len(rows)
    best_order = max(by_order, key=by_order.get)
    uniform = statistics.mean(
        statistics.mean(reward(answers[(row["question_id"], w)][1]) for w in row["workers"] if w in solo) for row in rows
    )
    best = {"policy": f"always the first shown of {' > '.join(best_order)}", "reward": by_order[best_order]}
    votes = {}
    if aggregators:
        for k in range(2, len(solo) + 1):
            total = 0.0
            for row in rows:
                shown = [w for w in ranked if w in row["workers"] and w in solo][:k]
                if any(a in row["workers"] for a in aggregators) and len(shown) >= 2:
                    voters = [answers[(row["question_id"], w)] for w in shown]
                    chosen = majority_index([answer for answer, _ in voters])
                    total += reward(voters[chosen][1])
                else:
                    total += reward(answers[(row["question_id"], shown[0])][1]) if shown else unparseable
            votes[k] = total / len(rows)
        k_best = max(votes, key=votes.get)
        if votes[k_best] > best["reward"]:
            best = {"policy": f"vote over the best {k_best} shown (else the best shown)", "reward": votes[k_best]}
    return {
        **best, "best_single_order": list(best_order), "best_single_reward": by_order[best_order], "vote_by_k": votes,
        "uniform_over_shown": uniform,
    }


# ---------------------------------------------------------------------------- the rung's runs


def _materialize_training(
    rung: Rung, artifacts: Path, trainer: dict, only: Sequence[str] | None = None
) -> dict[str, dict]:
    """The training chain (contested set, warm start, probe and its gate, GRPO) for one rung, as
    `make run` would materialize it, or only the assets named in `only`; returns each asset's metadata."""
    import dagster as dg

    from assets.training import TRAINING_ASSETS, TRAINING_CHECKS, pass_rates
    from resources.pool import PoolResource
    from resources.trainer import TrainerResource
    from resources.warehouse import WarehouseResource

    result = dg.materialize(
        [*TRAINING_ASSETS, *TRAINING_CHECKS, pass_rates],
        selection=dg.AssetSelection.assets(*(TRAINING_ASSETS if only is None else [dg.AssetKey(a) for a in only])),
        resources={
            "warehouse": WarehouseResource(database=str(artifacts / "warehouse.duckdb"), artifacts_root=str(artifacts)),
            "pool": PoolResource(pool=rung.pool),
            "trainer": TrainerResource(output_root=str(artifacts / "training"), **trainer),
        },
        raise_on_error=False,
    )
    metadata = {}
    for event in result.get_asset_materialization_events():
        metadata[event.asset_key.to_user_string()] = {k: v.value for k, v in event.materialization.metadata.items()}
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    return {"assets": metadata, "checks": checks, "success": result.success}


def _rung_artifacts(rung: Rung, source: Path, workdir: Path) -> Path:
    """A fresh artifacts root for the rung under `workdir`: a copy of the source warehouse, with the
    rung's pool probed when the source run did not probe it."""
    from conductor_pipeline.pools.config import load_pool
    from conductor_pipeline.warehouse import Warehouse

    artifacts = workdir / rung.name
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    shutil.copy2(source / "warehouse.duckdb", artifacts / "warehouse.duckdb")
    if Warehouse(artifacts / "warehouse.duckdb").query_file("pass_rates", {"pool": load_pool(rung.pool).name}).is_empty():
        _probe_pool(rung.pool, artifacts)
    return artifacts


def _probe_pool(pool: str, artifacts: Path) -> None:
    """Probe a pool the source run did not (free on replay): `make run`'s probe job, headless."""
    env = {**os.environ, ARTIFACTS_ENV: str(artifacts), "DAGSTER_HOME": str(artifacts / ".dagster_home")}
    (artifacts / ".dagster_home").mkdir(exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "assets.main", "--pool", pool, "--only", "probe_job"], env=env, check=True,
        stdout=subprocess.DEVNULL,
    )


def evaluate_policy(model: Path, rows: Sequence[dict], executor, settings) -> list[list[float]]:
    """Rewards of `samples` completions of each prompt row, sampled like rollouts and executed on the
    pool without recording them."""
    from conductor_pipeline.conductor.hf_policy import HFLocalPolicy
    from conductor_pipeline.training.reward import reward_for
    from conductor_pipeline.training.rollouts import execute_samples, sample_completions

    async def run() -> list:
        policy = HFLocalPolicy(model, device="cpu")
        try:
            sampled = await sample_completions(policy, rows, EVAL_SAMPLES, settings.max_completion_length)
        finally:
            await policy.aclose()
        return await execute_samples(executor, sampled)

    verdicts = asyncio.run(run())
    rewards = [reward_for(v, settings.reward_variant) for v in verdicts]
    return [rewards[i * EVAL_SAMPLES:(i + 1) * EVAL_SAMPLES] for i in range(len(rows))]


def paired_difference(first: Sequence[Sequence[float]], second: Sequence[Sequence[float]], seed: int = 0) -> dict:
    """Mean reward of `second` minus `first`, paired per prompt, with a 95% bootstrap interval over prompts."""
    a = np.array([np.mean(r) for r in first])
    b = np.array([np.mean(r) for r in second])
    difference = b - a
    draws = np.random.default_rng(seed).integers(0, len(difference), (2000, len(difference)))
    low, high = np.percentile(difference[draws].mean(axis=1), [2.5, 97.5])
    return {"first": float(a.mean()), "second": float(b.mean()), "difference": float(difference.mean()),
            "low": float(low), "high": float(high)}


def quarter_steps(frame) -> tuple[tuple[int, int], tuple[int, int]]:
    """The first and last quarter of a run's training steps (inclusive bounds), from its rollouts."""
    last = int(frame["training_step"].max())
    quarter = max(1, last // 4)
    return (1, quarter), (last - quarter + 1, last)


def rollouts_of_steps(frame, steps: tuple[int, int]):
    """The rollouts of the training steps in `steps` (inclusive bounds)."""
    return frame.filter((frame["training_step"] >= steps[0]) & (frame["training_step"] <= steps[1]))


def choices(frame, steps: tuple[int, int]) -> dict[str, object]:
    """Parse rate, the parsed rollouts' final workers by identity and by catalogue position, and
    their accuracy, over the rollouts of the steps in `steps` (inclusive)."""
    part = rollouts_of_steps(frame, steps)
    parsed = part.filter(part["parse_code"] == "ok")
    by_worker, by_position = Counter(), Counter()
    for row in parsed.iter_rows(named=True):
        final = row["workers"][-1]
        by_worker[final] += 1
        if row["catalogue"] and final in row["catalogue"]:
            by_position[list(row["catalogue"]).index(final)] += 1
    n = max(parsed.height, 1)
    return {
        "rollouts": part.height,
        "parse_rate": parsed.height / part.height if part.height else None,
        "parsed_accuracy": float(parsed["correct"].cast(float).mean()) if parsed.height else None,
        "final_by_worker": {w: round(c / n, 3) for w, c in sorted(by_worker.items())},
        "final_by_position": {p: round(c / n, 3) for p, c in sorted(by_position.items())},
    }


def favourite_shown_or_not(frame, steps: tuple[int, int]) -> dict[str, object]:
    """Whether the policy reads which workers its catalogue lists, or writes one name it has learnt
    whatever it is shown: over the rollouts of `steps`, the most common final worker among the
    parsed ones, and the parse rate and share of `unknown_worker` failures of the rollouts whose
    catalogue shows it against those whose catalogue does not."""
    part = rollouts_of_steps(frame, steps)
    rows = list(part.iter_rows(named=True))
    finals = Counter(row["workers"][-1] for row in rows if row["parse_code"] == "ok")
    if not finals:
        return {"favourite": None}
    favourite = finals.most_common(1)[0][0]
    split: dict[str, object] = {"favourite": favourite}
    for label, shown in (("shown", True), ("not_shown", False)):
        group = [row for row in rows if (favourite in (row["catalogue"] or [])) == shown]
        n = len(group)
        split[label] = {
            "rollouts": n,
            "parse_rate": sum(row["parse_code"] == "ok" for row in group) / n if n else None,
            "unknown_worker_share": sum(row["parse_code"] == "unknown_worker" for row in group) / n if n else None,
        }
    return split


def mapping_and_shuffle_checks(frame, answers: Mapping) -> dict[str, object]:
    """Two checks of the training loop itself. The reward's mapping from a written worker to a
    recorded answer: a parsed one-step replay rollout must score exactly the recorded verdict of the
    worker its number (or name) names in the catalogue it was shown. The sub-pool shuffle: across
    rollouts each worker should sit at every catalogue position about equally often (its mean
    relative position near 0.5)."""
    one_step = frame.filter((frame["parse_code"] == "ok") & (frame["workers"].list.len() == 1))
    agree = sum(
        bool(row["correct"]) == answers[(row["question_id"], row["workers"][0])][1]
        for row in one_step.iter_rows(named=True) if row["correct"] is not None
    )
    places: dict[str, list[float]] = {}
    for catalogue in frame["catalogue"].drop_nulls().to_list():
        for index, worker in enumerate(catalogue):
            places.setdefault(worker, []).append(index / max(len(catalogue) - 1, 1))
    return {
        "one_step_rollouts": one_step.height, "scored_as_recorded": agree,
        "mean_relative_position": {w: round(statistics.mean(v), 3) for w, v in sorted(places.items())},
    }


def rollouts_to_half_gap(step_rewards: Sequence[float], warm: float, optimum: float, per_step: int) -> int | None:
    """Rollouts until the reward, smoothed over a tenth of the run, first closes half of the gap
    between the warm start and the static optimum; None when it never does."""
    if optimum <= warm or not step_rewards:
        return None
    window = max(5, len(step_rewards) // 10)
    target = warm + (optimum - warm) / 2
    for end in range(window, len(step_rewards) + 1):
        if statistics.mean(step_rewards[end - window:end]) >= target:
            return end * per_step
    return None


def recorded_answers(store, pool) -> tuple[dict[tuple[str, str], tuple[str | None, bool]], list[str]]:
    """Every probed (question, worker) -> (extracted answer, correct) of the pool, and its workers
    ranked by train-split pass rate, best first."""
    from conductor_pipeline.probing.pass_rates import pass_rate_table
    from conductor_pipeline.splits import train_split_rows

    answers = {
        (r["question_id"], r["worker"]): (r["extracted_answer"], bool(r["correct"]))
        for r in store.query_file("probe_answers", {"pool": pool.name}).iter_rows(named=True)
    }
    rates = train_split_rows(pass_rate_table(store, pool.name), pool.worker_names)
    ranked = [w for w, _ in sorted(
        ((w, rates.filter(rates["worker"] == w)["pass_rate"].mean()) for w in rates["worker"].unique().to_list()),
        key=lambda item: (-item[1], item[0]),
    )]
    return answers, ranked


def vote_payoff(rung: Rung, source: Path, workdir: Path, min_pool_sizes: Sequence[int]) -> str:
    """What fanning out to the vote is worth on a vote-pool rung's training prompts, by the smallest
    sub-pool shown (`min_pool_size`): the best static single-worker policy's expected reward against
    the best vote over the k best shown, from the recordings; no policy is trained. Then the plain
    accuracy of each worker and of the vote over the top k on the training questions, every seat shown."""
    from conductor_pipeline.evaluation.vote import majority_index
    from conductor_pipeline.pools.config import load_pool
    from conductor_pipeline.training.dataset import build_training_set
    from conductor_pipeline.training.settings import GRPOSettings
    from conductor_pipeline.warehouse import Warehouse
    from resources.trainer import TrainerResource

    artifacts = _rung_artifacts(rung, source, workdir)
    store = Warehouse(artifacts / "warehouse.duckdb")
    pool = load_pool(rung.pool)
    _materialize_training(rung, artifacts, dict(rung.trainer), only=("contested_set",))
    recipe = TrainerResource(output_root=str(artifacts / "training"), **rung.trainer).recipe()
    training = build_training_set(
        store, pool, artifacts / "contested_set", naming=recipe.prompt.naming, n_examples=0,
        contested_subpools=recipe.data.contested_subpools,
    )
    answers, ranked = recorded_answers(store, pool)
    aggregators = [seat.name for seat in pool.workers if seat.is_vote]
    if not aggregators:
        raise SystemExit(f"{rung.name} ({rung.pool}) has no vote seat")
    lines = ["| smallest sub-pool | prompts showing the vote | best single order | best vote (k) | vote - single |",
             "|---:|---:|---:|---:|---:|"]
    for size in min_pool_sizes:
        rows = training.prompt_rows(GRPOSettings.cpu_paper_profile(min_pool_size=size))
        optimum = static_optimum(rows, answers, ranked, aggregators, "paper")
        single = optimum["best_single_reward"]
        k, vote = max(optimum["vote_by_k"].items(), key=lambda item: item[1])
        showing = sum(any(a in row["workers"] for a in aggregators) for row in rows)
        lines.append(f"| {size} | {showing} of {len(rows)} | {single:.3f} | {vote:.3f} ({k}) | {vote - single:+.3f} |")
    questions = sorted({q.question_id for q in training.questions})
    solo = [w for w in ranked if w not in aggregators]
    accuracy = {w: statistics.mean(answers[(q, w)][1] for q in questions) for w in solo}
    for k in range(2, len(solo) + 1):
        right = []
        for question in questions:
            voters = [answers[(question, w)] for w in solo[:k]]
            right.append(voters[majority_index([answer for answer, _ in voters])][1])
        accuracy[f"vote:top{k}"] = statistics.mean(right)
    lines += ["", f"Accuracy on the {len(questions)} training questions, every seat shown:", "",
              "| worker or vote | accuracy |", "|---|---:|", *(f"| {name} | {value:.3f} |" for name, value in accuracy.items())]
    return "\n".join(lines)


def run_rung(rung: Rung, source: Path, workdir: Path, budget: dict) -> dict:
    from conductor_pipeline.pools.backends.registry import build_workers
    from conductor_pipeline.pools.config import load_pool
    from conductor_pipeline.training.dataset import build_training_set
    from conductor_pipeline.training.rollouts import PoolExecutor
    from conductor_pipeline.warehouse import Warehouse
    from resources.trainer import TrainerResource

    artifacts = _rung_artifacts(rung, source, workdir)
    store = Warehouse(artifacts / "warehouse.duckdb")
    pool = load_pool(rung.pool)
    trainer_knobs = {**budget, **rung.trainer}
    started = time.monotonic()
    materialized = _materialize_training(rung, artifacts, trainer_knobs)
    elapsed = time.monotonic() - started
    trainer = TrainerResource(output_root=str(artifacts / "training"), **trainer_knobs)
    recipe = trainer.recipe()
    settings, prompt = recipe.grpo, recipe.prompt
    training = build_training_set(
        store, pool, artifacts / "contested_set", naming=prompt.naming, n_examples=prompt.n_examples,
        contested_subpools=recipe.data.contested_subpools, show_predicted_success=prompt.show_predicted_success,
    )
    rows = training.prompt_rows(settings)
    answers, ranked = recorded_answers(store, pool)
    aggregators = [seat.name for seat in pool.workers if seat.is_vote]
    optimum = static_optimum(rows, answers, ranked, aggregators, settings.reward_variant)
    record: dict[str, object] = {
        "rung": rung.name, "what": rung.what, "pool": rung.pool, "trainer": trainer_knobs, "static": optimum,
        "checks": materialized["checks"], "elapsed_s": round(elapsed, 1),
    }
    checkpoint = materialized["assets"].get("conductor_checkpoint")
    if checkpoint is None:
        record["verdict"] = f"not trained: {materialized['checks']}"
        return record
    run_id = checkpoint["training_run_id"]
    steps = store.query_file("training_steps_of_run", {"run_id": run_id})
    step_rewards = [float(r) for r in steps["reward_mean"].to_list()]
    workers = build_workers(pool, [seat.name for seat in pool.workers if not seat.is_conductor])
    executor = PoolExecutor(pool, workers, training.questions, prompt.naming, max_new_tokens=prompt.max_new_tokens)
    fixed = rows[:EVAL_PROMPTS]
    warm = evaluate_policy(trainer.start_policy_path(pool.name), fixed, executor, settings)
    trained = evaluate_policy(Path(checkpoint["checkpoint_path"]), fixed, executor, settings)
    per_step = settings.rollouts_per_step
    frame = store.query_file("rollout_choices", {"run_id": run_id})
    first_steps, last_steps = quarter_steps(frame)
    last = last_steps[1]
    fixed_static = static_optimum(fixed, answers, ranked, aggregators, settings.reward_variant)
    record.update(
        run_id=run_id, steps=last, rollouts=last * per_step, grpo_seconds=checkpoint.get("elapsed_s"),
        reward_per_step=step_rewards,
        fixed_prompts={
            "prompts": len(fixed), "samples": EVAL_SAMPLES, "static_optimum": fixed_static["reward"],
            "uniform_over_shown": fixed_static["uniform_over_shown"], **paired_difference(warm, trained),
        },
        first_quarter=choices(frame, first_steps), last_quarter=choices(frame, last_steps),
        loop_checks=mapping_and_shuffle_checks(frame, answers),
        rollouts_to_half_gap=rollouts_to_half_gap(
            step_rewards, statistics.mean(map(np.mean, warm)), optimum["reward"], per_step
        ),
    )
    record["verdict"] = verdict(record)
    return record


def _change(first: tuple[float, int], last: tuple[float, int]) -> tuple[float, float, float]:
    """last - first share, with a normal 95% interval (two independent proportions)."""
    (p1, n1), (p2, n2) = first, last
    difference = p2 - p1
    half = 1.96 * math.sqrt(p1 * (1 - p1) / max(n1, 1) + p2 * (1 - p2) / max(n2, 1))
    return difference, difference - half, difference + half


def verdict(record: Mapping) -> str:
    """learns routing / learns only the format / learns nothing, from the training rollouts of the
    run's first and last quarters: routing is the parsed rollouts' accuracy (the format held apart),
    the format their parse rate; each change must clear its 95% interval."""
    first, last = record["first_quarter"], record["last_quarter"]
    parsed_first, parsed_last = (round(q["parse_rate"] * q["rollouts"]) for q in (first, last))
    routing = _change((first["parsed_accuracy"] or 0, parsed_first), (last["parsed_accuracy"] or 0, parsed_last))
    parsing = _change((first["parse_rate"] or 0, first["rollouts"]), (last["parse_rate"] or 0, last["rollouts"]))
    if routing[1] > 0:
        return f"learns routing (parsed accuracy {routing[0]:+.2f} [{routing[1]:+.2f}, {routing[2]:+.2f}])"
    if parsing[1] > 0:
        return (f"learns the format, not routing (parse rate {parsing[0]:+.2f} [{parsing[1]:+.2f}, {parsing[2]:+.2f}], "
                f"parsed accuracy {routing[0]:+.2f} [{routing[1]:+.2f}, {routing[2]:+.2f}])")
    return f"does not learn (parsed accuracy {routing[0]:+.2f}, parse rate {parsing[0]:+.2f})"


def table(records: Sequence[Mapping]) -> str:
    lines = [
        "| rung | static optimum, all prompts (policy) | on the fixed prompts: static optimum / uniform over shown | "
        "warm start | trained | trained - warm [95% CI] | parse rate first / last quarter | parsed accuracy first / "
        "last | rollouts | to half the gap | verdict |",
        "|---|---|---:|---:|---:|---|---|---|---:|---:|---|",
    ]
    for r in records:
        static = r["static"]
        if "fixed_prompts" not in r:
            lines.append(f"| {r['rung']} | {static['reward']:.3f} | | | | | | | | | {r['verdict']} |")
            continue
        fixed, first, last = r["fixed_prompts"], r["first_quarter"], r["last_quarter"]
        half = r["rollouts_to_half_gap"]
        lines.append(
            f"| {r['rung']} | {static['reward']:.3f} ({static['policy']}) | {fixed['static_optimum']:.3f} / "
            f"{fixed['uniform_over_shown']:.3f} | {fixed['first']:.3f} | {fixed['second']:.3f} | {fixed['difference']:+.3f} [{fixed['low']:+.3f}, "
            f"{fixed['high']:+.3f}] | {first['parse_rate']:.2f} / {last['parse_rate']:.2f} | "
            f"{_fmt(first['parsed_accuracy'])} / {_fmt(last['parsed_accuracy'])} | {r['rollouts']:,} | "
            f"{'not reached' if half is None else f'{half:,}'} | {r['verdict']} |"
        )
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=None, help="a finished default run's artifacts root")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--rungs", nargs="+", default=list(RUNGS), choices=list(RUNGS))
    parser.add_argument("--steps", type=int, default=300, help="GRPO steps per rung")
    parser.add_argument("--group", type=int, default=8, help="rollouts per question")
    parser.add_argument("--questions", type=int, default=2, help="questions per step")
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KNOB=JSON",
                        help="a trainer knob for every rung, e.g. --set reward_variant='\"strict\"'")
    parser.add_argument("--torch-threads", type=int, default=DEFAULT_TORCH_THREADS)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON records here")
    parser.add_argument("--vote-payoff", nargs="+", type=int, metavar="MIN_POOL_SIZE", default=None,
                        help="train nothing: what the vote is worth on each rung's training prompts, by smallest sub-pool")
    args = parser.parse_args(argv)
    make_reproducible(torch_threads=args.torch_threads)
    source = args.source or artifacts_root()
    if not (source / "warehouse.duckdb").is_file():
        parser.error(f"no finished default run under {source}: run `make run`")
    budget: dict[str, object] = {"max_steps": args.steps, "num_generations": args.group, "questions_per_step": args.questions}
    if args.learning_rate is not None:
        budget["learning_rate"] = args.learning_rate
    budget.update((k, json.loads(v)) for k, v in (item.split("=", 1) for item in args.set))
    if args.vote_payoff is not None:
        for name in args.rungs:
            print(f"\n{name}: {RUNGS[name].what}\n\n{vote_payoff(RUNGS[name], source, args.workdir, args.vote_payoff)}")
        return 0
    records = []
    for name in args.rungs:
        record = run_rung(RUNGS[name], source, args.workdir, budget)
        records.append(record)
        print(f"{name}: {record['verdict']}", flush=True)
        if args.out is not None:
            args.out.write_text(json.dumps(records, indent=1, default=str))
    print("\n" + table(records))
    for record in records:
        print("\n" + json.dumps({k: v for k, v in record.items() if k != "reward_per_step"}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
