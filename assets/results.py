"""`make results`: the README's "what the default run shows" block, generated from a run.

    .venv/bin/python -m assets.results            # record the latest run and rewrite the README block
    .venv/bin/python -m assets.results --check    # exit 1 when the README block is not the record's

It reads the latest materializations in $DAGSTER_HOME (the gate, the warm start, training and the
eval tables the eval run wrote beside the warehouse), records the figures with the commit, the CPU
(`cpu_signature`: another CPU's float kernels can train another conductor) and the eval run id
in `docs/results/default-run.json`, and renders the block between the README's
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

from assets.metadata import latest_metadata
from conductor_pipeline.paths import PROJECT_ROOT

RECORD_PATH = PROJECT_ROOT / "docs" / "results" / "default-run.json"
README_PATH = PROJECT_ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
# The arms the block shows, in reading order (conductor arms are added after them).
SHOWN_ARMS = ("best_single", "random", "vote:top5", "oracle")


def _value(metadata: Mapping | None, key: str) -> object:
    entry = (metadata or {}).get(key)
    return None if entry is None else entry.value


def eval_tables_event(instance: dg.DagsterInstance, pool: str | None = None) -> dg.EventLogEntry:
    """The latest `eval_tables` materialization, or with `pool` the latest of a run tagged with that
    pool: an instance that also evaluated a checkpoint on other pool files holds those evals too."""
    for record in instance.fetch_materializations(dg.AssetKey("eval_tables"), limit=1000, ascending=False).records:
        run = instance.get_run_by_id(record.run_id)
        if pool is None or (run is not None and run.tags.get("pool") == pool):
            return record.event_log_entry
    where = "" if pool is None else f" of a run on pool {pool!r}"
    raise SystemExit(f"no eval_tables materialization{where} in $DAGSTER_HOME: run `make run` first")


def record_from_instance(instance: dg.DagsterInstance, pool: str | None = None) -> dict[str, object]:
    """The figures of the latest default run (with `pool`, of the latest eval on that pool): the gate,
    the warm start, training and the eval tables."""
    return record_from_event(instance, eval_tables_event(instance, pool))


def record_from_event(instance: dg.DagsterInstance, event: dg.EventLogEntry) -> dict[str, object]:
    """The figures of the run whose `eval_tables` materialization is `event` (`eval_tables_event`)."""
    tables = event.asset_materialization.metadata
    run = instance.get_run_by_id(event.run_id)
    run_id, folder = str(_value(tables, "run_id")), Path(str(_value(tables, "tables_dir")))
    arms = pl.read_parquet(folder / f"{run_id}_arms.parquet")
    pairs = pl.read_parquet(folder / f"{run_id}_conductor_pairs.parquet")
    agreement = pl.read_parquet(folder / f"{run_id}_order_agreement.parquet")
    probe, warm, checkpoint = (latest_metadata(instance, a) for a in ("grpo_probe_run", "warm_start_policy", "conductor_checkpoint"))
    accuracy = {r["arm"]: {"accuracy": r["accuracy"], "parsed": r["parse_ok_share"]} for r in arms.iter_rows(named=True)}
    tags = run.tags if run else {}
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


def three_places(value: object) -> str:
    """A rate or p-value as the tables print it: three decimals, or n/a."""
    return "n/a" if value is None else f"{float(value):.3f}"


def trained_arms(arms: Sequence[str]) -> list[str]:
    """The trained conductor arms: conductor arms that are neither a warm start nor a reordering."""
    return [a for a in arms if a.startswith("conductor:") and "warm_start" not in a and "@" not in a]


def paired_points(row: Mapping) -> str:
    """A paired difference in points with its interval: `+6.2 [+1.6, +11.2]`."""
    return f"{100 * row['difference']:+.1f} [{100 * row['difference_low']:+.1f}, {100 * row['difference_high']:+.1f}]"


def on_cpu(record: Mapping) -> str:
    """` on AMD EPYC (avx2)`: the CPU of a run, for records that name one (older ones do not)."""
    cpu = record.get("cpu")
    return f" on {cpu}" if cpu and cpu != "unknown" else ""


def render_block(record: Mapping) -> str:
    """The README block: one table of the run, tied to its commit and eval run id."""
    gate, warm, training = record["gate"], record["warm_start"], record["training"]
    arms = record["arms"]
    conductors = sorted(arm for arm in arms if arm.startswith("conductor:"))
    lines = [
        f"From `make run` at commit `{record['commit']}`{on_cpu(record)} (eval run `{record['eval_run_id']}`, "
        f"{record['questions']} MATH level-5 eval questions); `make results` wrote this block from that run.",
        "",
        "| arm | accuracy | parsed | against it, the trained conductor (pts, paired 95% CI) |",
        "|---|---:|---:|---|",
    ]
    trained = next(iter(trained_arms(conductors)), None)
    for arm in [*SHOWN_ARMS, *conductors]:
        if arm not in arms:
            continue
        pair = next((p for p in record["conductor_pairs"] if p["arm"] == trained and p["reference"] == arm), None)
        versus = f"{paired_points(pair)}, {pair['verdict']}" if pair else ""
        lines.append(f"| `{arm}` | {three_places(arms[arm]['accuracy'])} | {three_places(arms[arm]['parsed'])} | {versus} |")
    lines += [
        "",
        f"Gate: {three_places(gate['flat_groups'])} of {gate['groups']} probe groups (group size {gate['group_size']}) had "
        f"equal rewards, {three_places(gate['same_correctness'])} one correctness. Warm start: parse rate "
        f"{three_places(warm['parse_rate_before'])} -> {three_places(warm['parse_rate_after'])}, its picks against uniform over the "
        f"catalogue positions chi-square p = {three_places(warm['position_balance_p'])}. Training: `{training['run_id']}`, "
        f"{training['steps']} steps of groups of {training['group_size']}.",
    ]
    for row in record["order_agreement"]:
        lines.append(
            f"Order invariance of `{row['arm']}`: with the catalogue shuffled per question it sent "
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
    record = record_from_instance(dg.DagsterInstance.get())
    RECORD_PATH.parent.mkdir(parents=True, exist_ok=True)
    RECORD_PATH.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    README_PATH.write_text(replace_block(README_PATH.read_text(), render_block(record)))
    print(f"recorded {RECORD_PATH.relative_to(PROJECT_ROOT)} and rewrote the README block (commit {record['commit']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
