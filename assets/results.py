"""`make results`: the README's "what the default run shows" block, generated from a run.

    .venv/bin/python -m assets.results            # record the latest run and rewrite the README block
    .venv/bin/python -m assets.results --check    # exit 1 when the README block is not the record's

It reads the latest materializations in $DAGSTER_HOME (the gate, the warm start, training and the
eval tables the eval run wrote beside the warehouse) of the default run (seed 0 of the default
recipe), and every seed run of that recipe (`make seeds`), records the figures with the commit, the
CPU (`cpu_signature`: another CPU's float kernels can train another conductor) and the eval run id
in `docs/results/default-run.json` (its `seeds`: one entry per seed run; `pooled`: the trained
arm's verdicts pooled over them), and renders the block between the README's
`<!-- results:begin -->` and `<!-- results:end -->` markers from that record. A test renders the
record again and compares it with the README, so the README's figures are the recorded run's; the
slow test `tests/assets/test_results.py::test_a_fresh_default_run_reproduces_the_record` runs the
default graph and compares its figures with the record, so the record is what the code produces.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import dagster as dg
import polars as pl

from assets.deployment import QUICK_EVAL_TAG, RECIPE_TAG, SEED_TAG, trained_otherwise
from assets.instance import open_instance
from assets.metadata import latest_metadata_of, materializations, newest_tagged
from conductor_pipeline.evaluation.markdown import fmt_p
from conductor_pipeline.evaluation.seeds import (
    POOLED_TEST,
    SeedScores,
    accuracy_spread,
    pooled_comparisons,
    pooled_frame,
    pooled_markdown,
    pooled_pairs,
)
from conductor_pipeline.paths import PROJECT_ROOT
from resources.pool import default_pool_name

RECORD_PATH = PROJECT_ROOT / "docs" / "results" / "default-run.json"
README_PATH = PROJECT_ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
# The arms the block shows, in reading order (conductor arms are added after them).
SHOWN_ARMS = ("best_single", "random", "w_router", "vote:top5", "oracle")
# The recipe the README records: the trainer's default profile without a settings file.
DEFAULT_RECIPE = "cpu"
# The pool of test models (held out of training) `make run` and `make seeds` evaluate the trained
# conductor on after the default pool (data/pools/, `assets.evaluate_checkpoint --trained`).
UNSEEN_POOL = "replay-test-six"


def _value(metadata: Mapping | None, key: str) -> object:
    entry = (metadata or {}).get(key)
    return None if entry is None else entry.value


def eval_tables_event(
    instance: dg.DagsterInstance,
    pool: str | None = None,
    tags: Mapping[str, str] | None = None,
    include_quick: bool = True,
) -> dg.EventLogEntry:
    """The latest `eval_tables` materialization, or with `pool` the latest of a run tagged with that
    pool (and with `tags`, one whose run carries them too): an instance that also evaluated a
    checkpoint on other pool files, or other seeds, holds those evals too. Without `include_quick`,
    an eval of the conductor alone (`QUICK_EVAL_TAG`) is passed over."""
    wanted = {**({"pool": pool} if pool is not None else {}), **(tags or {})}
    found = newest_tagged(instance, "eval_tables", wanted, skip=None if include_quick else is_quick_eval)
    if found is not None:
        return found[1]
    where = "" if pool is None else f" of a run on pool {pool!r}"
    where += "".join(f", {key} {value!r}" for key, value in (tags or {}).items())
    raise SystemExit(f"no eval_tables materialization{where} in $DAGSTER_HOME: run `make run` first")


def is_quick_eval(tags: Mapping[str, str]) -> bool:
    """Whether a run evaluated the trained conductor alone (`evaluate_checkpoint --quick`)."""
    return tags.get(QUICK_EVAL_TAG) == "true"


def record_from_instance(
    instance: dg.DagsterInstance, pool: str | None = None, tags: Mapping[str, str] | None = None
) -> dict[str, object]:
    """The figures of the latest full default run (with `pool`, of the latest full eval on that pool;
    with `tags`, of a run that carries them): the gate, the warm start, training and the eval tables."""
    return record_from_event(instance, eval_tables_event(instance, pool, tags, include_quick=False))


def record_from_event(instance: dg.DagsterInstance, event: dg.EventLogEntry) -> dict[str, object]:
    """The figures of the run whose `eval_tables` materialization is `event` (`eval_tables_event`)."""
    tables = event.asset_materialization.metadata
    run = instance.get_run_by_id(event.run_id)
    run_id, folder = str(_value(tables, "run_id")), Path(str(_value(tables, "tables_dir")))
    arms = pl.read_parquet(folder / f"{run_id}_arms.parquet")
    pairs = pl.read_parquet(folder / f"{run_id}_conductor_pairs.parquet")
    agreement = pl.read_parquet(folder / f"{run_id}_order_agreement.parquet")
    tags = run.tags if run else {}
    # A seed run's gate, warm start and training are its own seed's (older runs carry no seed tag).
    behind = {key: tags[key] for key in ("pool", SEED_TAG) if key in tags} if SEED_TAG in tags else {}
    skip = trained_otherwise(tags) if behind else None
    probe, warm, checkpoint = (
        latest_metadata_of(instance, asset, behind, skip)
        for asset in ("grpo_probe_run", "warm_start_policy", "conductor_checkpoint")
    )
    accuracy = {r["arm"]: {"accuracy": r["accuracy"], "parsed": r["parse_ok_share"]} for r in arms.iter_rows(named=True)}
    return {
        "commit": tags.get("git_commit", "unknown"),
        # The float kernels the figures came from: another CPU can train another conductor.
        "cpu": tags.get("cpu", "unknown"),
        "eval_run_id": run_id,
        "questions": int(_value(tables, "n_scored")),
        "gate": {
            "flat_groups": _value(probe, "flat_reward_fraction"), "groups": _value(probe, "groups"),
            "group_size": _value(probe, "group_size"), "same_correctness": _value(probe, "same_correctness_fraction"),
        },
        "warm_start": {
            "parse_rate_before": _value(warm, "parse_rate_before"), "parse_rate_after": _value(warm, "parse_rate_after"),
            "position_balance_p": ((_value(warm, "choice_balance") or {}).get("by_position") or {}).get("p_value"),
        },
        "training": {"run_id": _value(checkpoint, "training_run_id"), "steps": _value(checkpoint, "global_step"),
                     "group_size": _value(checkpoint, "group_size")},
        "arms": accuracy,
        "conductor_pairs": pairs.select("arm", "reference", "difference", "difference_low", "difference_high",
                                        "verdict").to_dicts(),
        "order_agreement": agreement.to_dicts(),
    }


def seed_eval_events(
    instance: dg.DagsterInstance, pool: str, recipe: str, seeds: Sequence[int] | None = None
) -> dict[int, dg.EventLogEntry]:
    """The latest full `eval_tables` materialization of each seed of `recipe` on `pool` (of `seeds`
    only, when given), by seed: a quick eval lacks the warm start and twin the verdicts pair with."""
    events: dict[int, dg.EventLogEntry] = {}
    for tags, event in materializations(instance, "eval_tables", limit=10_000):
        if tags.get("pool") != pool or tags.get(RECIPE_TAG) != recipe or SEED_TAG not in tags or is_quick_eval(tags):
            continue
        if seeds is None or int(tags[SEED_TAG]) in seeds:
            events.setdefault(int(tags[SEED_TAG]), event)
    return dict(sorted(events.items()))


def question_scores_of(event: dg.EventLogEntry) -> pl.DataFrame:
    """(arm, question_id, score) of the eval run whose tables `event` wrote."""
    metadata = event.asset_materialization.metadata
    run_id, folder = metadata["run_id"].value, Path(str(metadata["tables_dir"].value))
    path = folder / f"{run_id}_question_scores.parquet"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: the eval of run {run_id} predates per-question scores; rerun its seed")
    return pl.read_parquet(path)


def seeds_summary(
    instance: dg.DagsterInstance, pool: str, recipe: str, seeds: Sequence[int] | None = None
) -> dict[str, object]:
    """Every seed run of `recipe` on `pool` (of `seeds` only, when given: seed, CPU, commit, arms) and
    the trained arms' verdicts pooled over them, with each arm's accuracy spread over the seeds and
    the pooled table as markdown."""
    events = seed_eval_events(instance, pool, recipe, seeds)
    if not events:
        raise SystemExit(f"no evaluation of a seed run of recipe {recipe!r} on pool {pool!r} in $DAGSTER_HOME")
    records = {seed: record_from_event(instance, event) for seed, event in events.items()}
    runs = [SeedScores(seed, question_scores_of(event)) for seed, event in events.items()]
    trained = sorted({arm for record in records.values() for arm in trained_arms(list(record["arms"]))})
    pairs = pooled_pairs(
        [[(p["arm"], p["reference"]) for p in record["conductor_pairs"]] for record in records.values()], trained
    )
    comparisons = pooled_comparisons(runs, pairs)
    arms = sorted({arm for record in records.values() for arm in record["arms"]})
    return {
        "pool": pool,
        "recipe": recipe,
        "seeds": [
            {"seed": seed, "cpu": record["cpu"], "commit": record["commit"], "eval_run_id": record["eval_run_id"],
             "training_run_id": record["training"]["run_id"], "arms": record["arms"]}
            for seed, record in records.items()
        ],
        "spread": {
            arm: accuracy_spread({s: r["arms"][arm]["accuracy"] for s, r in records.items() if arm in r["arms"]})
            for arm in arms
        },
        "pooled": pooled_frame(comparisons).to_dicts(),
        "pooled_markdown": pooled_markdown(comparisons),
        "missing_trained": [
            {"seed": seed, "arms": [arm for arm in trained if arm not in record["arms"]]}
            for seed, record in records.items() if any(arm not in record["arms"] for arm in trained)
        ],
    }


def summary_text(summary: Mapping[str, object]) -> str:
    """The console's summary: each seed's trained accuracy and CPU, the spread, and the pooled verdicts."""
    lines = [f"## {summary['recipe']} on {summary['pool']}: {len(summary['seeds'])} seeds", ""]
    for run in summary["seeds"]:
        trained = trained_arms(list(run["arms"]))
        figures = ", ".join(f"{arm} {run['arms'][arm]['accuracy']:.3f}" for arm in trained) or "no trained arm"
        lines.append(f"- seed {run['seed']} on {run['cpu']} at {run['commit']}: {figures}")
    for missing in summary["missing_trained"]:
        lines.append(f"- seed {missing['seed']} has no evaluation of {', '.join(missing['arms'])} (its gate closed "
                     "or its training failed)")
    lines += ["", str(summary["pooled_markdown"])]
    return "\n".join(lines)


def against_the_record(record: Mapping, arms: Mapping[str, Mapping[str, float]]) -> list[str]:
    """For each trained arm of a run (`arms`: its arm -> figures), its accuracy against the recorded
    seeds' spread: what a run on another machine or seed is checked against."""
    lines = []
    for arm in trained_arms(list(arms)):
        spread = record.get("spread", {}).get(arm)
        if spread is None:
            continue
        accuracy = arms[arm]["accuracy"]
        inside = "inside" if spread["min"] <= accuracy <= spread["max"] else "OUTSIDE"
        # The spread is over the seeds that trained the arm: a seed whose gate closed has no figure.
        trained = sum(arm in seed.get("arms", {}) for seed in record["seeds"])
        lines.append(
            f"{arm}: {three_places(accuracy)}, {inside} the recorded {trained} seeds' "
            f"[{three_places(spread['min'])}, {three_places(spread['max'])}] ({RECORD_PATH.relative_to(PROJECT_ROOT)})"
        )
    return lines


def three_places(value: object) -> str:
    """A rate or p-value as the tables print it: three decimals, or n/a."""
    return "n/a" if value is None else f"{float(value):.3f}"


def trained_arms(arms: Sequence[str]) -> list[str]:
    """The trained conductor arms: conductor arms that are neither a warm start nor a reordering."""
    return [a for a in arms if a.startswith("conductor:") and "warm_start" not in a and "@" not in a]


def paired_points(row: Mapping) -> str:
    """A paired difference in points with its interval: `+6.2 [+1.6, +11.2]`."""
    return f"{100 * row['difference']:+.1f} [{100 * row['difference_low']:+.1f}, {100 * row['difference_high']:+.1f}]"


def _accuracy_cell(spread: Mapping | None, value: float) -> str:
    """An arm's accuracy over the seeds: `0.464 [0.451, 0.482]` (mean, min, max), or one figure when
    every seed scored the same (the workers, the votes and the routers do not depend on the seed)."""
    if spread is None or spread["min"] == spread["max"]:
        return three_places(value if spread is None else spread["mean"])
    return f"{three_places(spread['mean'])} [{three_places(spread['min'])}, {three_places(spread['max'])}]"


def _machines(seeds: Sequence[Mapping]) -> str:
    """`seeds 0, 1, 2 on AMD EPYC (avx512)`, one clause per CPU."""
    by_cpu: dict[str, list[str]] = {}
    for run in seeds:
        by_cpu.setdefault(str(run["cpu"]), []).append(str(run["seed"]))
    return "; ".join(f"seed{'s' if len(ids) > 1 else ''} {', '.join(ids)} on {cpu}" for cpu, ids in by_cpu.items())


def arms_table(arms: Mapping, spread: Mapping, pooled: Sequence[Mapping]) -> list[str]:
    """The block's table of one pool: the reference arms and every conductor arm over the seeds,
    and the trained conductor's pooled verdict against each reference."""
    conductors = sorted(arm for arm in arms if arm.startswith("conductor:"))
    trained = next(iter(trained_arms(conductors)), None)
    lines = [
        "| arm | accuracy (mean [min, max] over seeds) | parsed | the trained conductor against it (pts, unadjusted 95% CI) "
        "| p (Holm) | verdict | verdicts per seed |",
        "|---|---:|---:|---|---:|---|---|",
    ]
    for arm in [*SHOWN_ARMS, *conductors]:
        if arm not in arms:
            continue
        pair = next((p for p in pooled if p["arm"] == trained and p["reference"] == arm), None)
        versus = (
            f"{paired_points(pair)} | {fmt_p(pair['p_holm'])} | {pair['verdict']} | "
            f"{', '.join(pair['per_seed_verdict'])}" if pair else " | | | "
        )
        lines.append(f"| `{arm}` | {_accuracy_cell(spread.get(arm), arms[arm]['accuracy'])} | "
                     f"{three_places(arms[arm]['parsed'])} | {versus} |")
    return lines


def _twin_lines(pooled: Sequence[Mapping]) -> list[str]:
    return [f"With the catalogue shuffled per question, `{p['arm']}` against `{p['reference']}`: {paired_points(p)}, "
            f"{p['verdict']}." for p in pooled if "@" in p["arm"]]


def _seed_list(pooled: Sequence[Mapping]) -> str:
    """`seeds 0, 1, 3`: the seeds the pooled verdicts of the block's trained conductor drew on."""
    seeds = sorted({seed for row in pooled if "@" not in row["arm"] for seed in row["seeds"]})
    return f"seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}"


def render_block(record: Mapping) -> str:
    """The README block: the default recipe's arms over its seeds, the trained conductor's verdicts
    pooled over them (and each seed's), tied to the commit, the CPUs and the seed-0 eval run; then
    the same on the pool of test models it never saw, when the record has it."""
    gate, warm, training = record["gate"], record["warm_start"], record["training"]
    seeds = record["seeds"]
    n_seeds = len(seeds)
    lines = [
        f"From `make seeds` ({n_seeds} seed{'s' if n_seeds > 1 else ''} of the default recipe; {_machines(seeds)}) at "
        f"commit `{record['commit']}`, {record['questions']} MATH level-5 eval questions (seed 0's eval run "
        f"`{record['eval_run_id']}`); `make results` wrote this block from those runs.",
        "",
        f"On the default pool, `{record.get('pool', default_pool_name())}` (the workers it was trained with):",
        "",
        *arms_table(record["arms"], record["spread"], record["pooled"]),
    ]
    unseen = record.get("unseen_pool")
    if unseen:
        lines += [
            "",
            f"On `{unseen['pool']}`, test models no part of its training saw ({unseen['questions']} questions; "
            f"seed 0's eval run `{unseen['eval_run_id']}`):",
            "",
            *arms_table(unseen["arms"], unseen["spread"], unseen["pooled"]),
        ]
    lines += [
        "",
        f"Verdicts: {POOLED_TEST} ({len(record['pooled'])} comparisons per pool), at 95%; it pools the seeds that "
        f"evaluated both arms ({_seed_list(record['pooled'])}) and the questions every such seed evaluated. Per seed: the "
        "same test on that seed's questions alone. The intervals are not adjusted: one can exclude 0 where the "
        "adjusted verdict ties.",
        *(f"Seed {m['seed']} trained no {', '.join(m['arms'])}: its zero-variance gate closed, or its training failed "
          "(its gate figure is in the seed's run)." for m in record.get("missing_trained", [])),
        *_twin_lines(record["pooled"]),
        *(f"On `{unseen['pool']}`: {line[0].lower()}{line[1:]}" for line in (_twin_lines(unseen["pooled"]) if unseen else [])),
        f"Seed 0: gate {three_places(gate['flat_groups'])} of {gate['groups']} probe groups (group size "
        f"{gate['group_size']}) had equal rewards, {three_places(gate['same_correctness'])} one correctness. Warm start: "
        f"parse rate {three_places(warm['parse_rate_before'])} -> {three_places(warm['parse_rate_after'])}, its picks against "
        f"uniform over the catalogue positions chi-square p = {three_places(warm['position_balance_p'])}. Training: "
        f"`{training['run_id']}`, {training['steps']} steps of groups of {training['group_size']}.",
    ]
    for row in record["order_agreement"]:
        lines.append(
            f"Order invariance of `{row['arm']}` (seed 0): with the catalogue shuffled per question it sent "
            f"{three_places(row['same_final_worker'])} of the {row['both_parsed']} questions both parsed to the same final worker."
        )
    return "\n".join(lines)


def replace_block(readme: str, block: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"the README has no {BEGIN} ... {END} block")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def readme_block(readme: str) -> str:
    return readme.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare the README block with the record")
    args = parser.parse_args(argv)
    if args.check:
        expected = render_block(json.loads(RECORD_PATH.read_text()))
        if readme_block(README_PATH.read_text()) != expected:
            print(f"README.md's results block is not {RECORD_PATH.relative_to(PROJECT_ROOT)}'s: run `make results`")
            return 1
        return 0
    pool = default_pool_name()
    instance = open_instance()
    record = record_from_instance(instance, pool, {RECIPE_TAG: DEFAULT_RECIPE, SEED_TAG: "0"})
    summary = seeds_summary(instance, pool, DEFAULT_RECIPE)
    record.update({"pool": pool, **{key: summary[key] for key in ("recipe", "seeds", "spread", "pooled", "missing_trained")}})
    unseen = record_from_instance(instance, UNSEEN_POOL, {RECIPE_TAG: DEFAULT_RECIPE, SEED_TAG: "0"})
    unseen_summary = seeds_summary(instance, UNSEEN_POOL, DEFAULT_RECIPE)
    record["unseen_pool"] = {
        "pool": UNSEEN_POOL, "questions": unseen["questions"], "eval_run_id": unseen["eval_run_id"],
        "arms": unseen["arms"], "conductor_pairs": unseen["conductor_pairs"],
        "order_agreement": unseen["order_agreement"],
        **{key: unseen_summary[key] for key in ("seeds", "spread", "pooled")},
    }
    RECORD_PATH.parent.mkdir(parents=True, exist_ok=True)
    RECORD_PATH.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    README_PATH.write_text(replace_block(README_PATH.read_text(), render_block(record)))
    print(f"recorded {RECORD_PATH.relative_to(PROJECT_ROOT)} and rewrote the README block (commit {record['commit']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
