"""What a conductor trained at the paper's rollout budget does, read back from its run.

    CORYPHAEUS_TRAINER_PROFILE=cpu-paper .venv/bin/python -m assets.main --pool POOL --torch-threads 1
    .venv/bin/python -m benchmarks.paper_budget_report --pool POOL [--home DAGSTER_HOME] [--curves OUT.png]

It reads the run's latest materializations (the instance in `--home`, default $DAGSTER_HOME; the eval
is the latest on POOL, so evals of the checkpoint on other pool files do not stand in for it) and the
warehouse and eval tables under the artifacts root they name, and prints the markdown of
`benchmarks/RESULTS-paper-budget.md`'s section for that pool: the trained arm against the best
single worker, its warm start, random routing and `vote:top5`, paired on the same questions; its
fan-out share (`sql/workflow_fan_out.sql`) and cost per question against `vote:top5`'s; its order
invariance (the same final worker and workers, and the accuracy paired, with the catalogue shuffled
per question); and the learnability ladder's verdict on the training run's own rollouts (parse rate,
parsed accuracy and, on a vote pool, fan-out share: the first quarter of its steps against the
last), and whether it reads the catalogue's membership: the parse rate of rollouts whose catalogue
shows the run's favourite final worker against those whose catalogue does not. `--curves` copies
the training run's curves (reward, routing signal, parse failures, fan-out share) to a PNG.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import dagster as dg
import polars as pl

from assets.metadata import latest_metadata
from assets.results import eval_tables_event, paired_points, record_from_event, three_places, trained_arms
from benchmarks.learnability import choices, favourite_shown_or_not, quarter_steps, verdict
from conductor_pipeline.evaluation.cascades import CascadeArm
from conductor_pipeline.evaluation.frames import fan_out_by_arm
from conductor_pipeline.evaluation.learning import compare_pairs
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.stats import PairedComparison, compare_paired
from conductor_pipeline.warehouse import Warehouse


def trained_arm(arms: list[str]) -> str:
    """The run's one trained conductor arm."""
    trained = trained_arms(arms)
    if len(trained) != 1:
        raise SystemExit(f"expected one trained conductor arm among {arms}")
    return trained[0]


def shuffled_against_file_order(workflows: pl.DataFrame, arm: str, shuffled_arm: str) -> PairedComparison:
    """`shuffled_arm` (the catalogue shuffled per question) against `arm` (file order), paired on the
    questions both answered: whether the conductor reads the catalogue or a position in it."""
    verdicts = (
        workflows.filter(pl.col("arm").is_in([arm, shuffled_arm]))
        .with_columns(pl.col("correct").fill_null(False).cast(pl.Float64))
        .pivot(on="arm", index="question_id", values="correct", aggregate_function="mean")
        .drop_nulls()
    )
    return compare_paired(verdicts[shuffled_arm].to_numpy(), verdicts[arm].to_numpy())


def latest_eval(pool_name: str, instance: dg.DagsterInstance) -> tuple[dict, Path, Warehouse]:
    """The latest eval of `pool_name`: its record, its tables folder and the warehouse beside it."""
    event = eval_tables_event(instance, pool_name)
    folder = Path(str(event.asset_materialization.metadata["tables_dir"].value))
    return record_from_event(instance, event), folder, Warehouse(folder.parent / "warehouse.duckdb")


def section(pool_name: str, instance: dg.DagsterInstance) -> tuple[str, Path | None]:
    record, folder, warehouse = latest_eval(pool_name, instance)
    run_id = record["eval_run_id"]
    arms = pl.read_parquet(folder / f"{run_id}_arms.parquet")
    trained = trained_arm(arms["arm"].to_list())
    pairs = [p for p in record["conductor_pairs"] if p["arm"] == trained]
    accuracy = {a: v["accuracy"] for a, v in record["arms"].items()}
    cost = dict(zip(arms["arm"], arms["cost_per_question"], strict=True))

    aggregators = sorted(seat.name for seat in load_pool(pool_name).workers if seat.is_vote)
    fan_out = "no vote seat in this pool"
    if aggregators:
        flags = warehouse.query_file("workflow_fan_out", {"run_id": run_id, "aggregators": aggregators})
        share = fan_out_by_arm(flags.filter(pl.col("arm") == trained))
        fan_out = (
            f"{share['share'][0]:.3f} of {share['workflows'][0]} workflows; more than one model call on "
            f"{share['more_than_one_call'][0]:.3f}; an agreeing vote stopped it early on {share['stopped_early'][0]} "
            f"({share['stopped_right'][0]} right, {share['stopped_wrong'][0]} wrong)"
            if share.height else "none parsed"
        )

    training = record["training"]
    rollouts = warehouse.query_file("rollout_choices", {"run_id": training["run_id"]})
    first_steps, last_steps = quarter_steps(rollouts)
    quarters = {"first_quarter": choices(rollouts, first_steps), "last_quarter": choices(rollouts, last_steps)}
    lines = [
        f"### {pool_name}",
        "",
        f"Commit `{record['commit']}`, training run `{training['run_id']}` ({training['steps']} steps of "
        f"{training['group_size']}-rollout groups), eval run `{run_id}` ({record['questions']} questions).",
        "",
        "| the trained conductor against | its accuracy | theirs | difference (pts) [95% CI] | verdict |",
        "|---|---:|---:|---|---|",
    ]
    for pair in sorted(pairs, key=lambda p: p["reference"]):
        lines.append(f"| `{pair['reference']}` | {accuracy[trained]:.3f} | {accuracy.get(pair['reference'], float('nan')):.3f} "
                     f"| {paired_points(pair)} | {pair['verdict']} |")
    vote_cost = cost.get("vote:top5")
    lines += [
        "",
        f"Fan-out share of `{trained}`: {fan_out}. Cost per question: {cost[trained]:.5f} USD"
        + (f" against `vote:top5`'s {vote_cost:.5f} ({cost[trained] / vote_cost:.0%})." if vote_cost else "."),
    ]
    workflows = warehouse.query_file("eval_workflows", {"run_id": run_id})
    cascades = sorted(arm for arm in cost if arm.startswith(CascadeArm.PREFIX))
    if cascades:
        against = compare_pairs(workflows, [(trained, arm) for arm in cascades])
        lines += [
            "",
            "Against the static agreement cascades chosen on the train split (paired, Holm over these rows only):",
            "",
            "| cascade | its accuracy | cost per question | the trained conductor against it (pts) [95% CI] | verdict |",
            "|---|---:|---:|---|---|",
        ]
        for (_, arm), comparison in against.items():
            lines.append(
                f"| `{arm}` | {comparison.reference_accuracy:.3f} | {cost[arm]:.5f} | "
                f"{100 * comparison.difference.value:+.1f} [{100 * comparison.difference.low:+.1f}, "
                f"{100 * comparison.difference.high:+.1f}] | {comparison.verdict} |"
            )
        lines.append("")
    for row in record["order_agreement"]:
        shift = shuffled_against_file_order(workflows, row["arm"], row["shuffled_arm"])
        lines.append(
            f"Catalogue shuffled per question (`{row['arm']}`): {row['same_final_worker']:.3f} of {row['both_parsed']} "
            f"questions went to the same final worker, {row['same_workers']:.3f} to the same workers; accuracy "
            f"{shift.arm_accuracy:.3f} against {shift.reference_accuracy:.3f} in file order, "
            f"{100 * shift.difference.value:+.1f} [{100 * shift.difference.low:+.1f}, {100 * shift.difference.high:+.1f}] pts."
        )
    first, last = quarters["first_quarter"], quarters["last_quarter"]
    lines += [
        "",
        f"Training rollouts, first quarter of the steps -> last ({first['rollouts']:,} rollouts each): parse rate "
        f"{first['parse_rate']:.2f} -> {last['parse_rate']:.2f}, parsed accuracy {first['parsed_accuracy']:.2f} -> "
        f"{last['parsed_accuracy']:.2f}; the ladder's verdict: {verdict(quarters)}.",
    ]
    for name, steps in (("first", first_steps), ("last", last_steps)):
        split = favourite_shown_or_not(rollouts, steps)
        if split["favourite"] is None:
            continue
        shown, hidden = split["shown"], split["not_shown"]
        lines.append(
            f"{name.capitalize()} quarter's favourite final worker, `{split['favourite']}`: parse rate "
            f"{three_places(shown['parse_rate'])} of {shown['rollouts']:,} rollouts whose catalogue shows it, "
            f"{three_places(hidden['parse_rate'])} of {hidden['rollouts']:,} whose catalogue does not "
            f"(`unknown_worker` there: {three_places(hidden['unknown_worker_share'])})."
        )
    if aggregators:
        flags = warehouse.query_file("workflow_fan_out", {"run_id": training["run_id"], "aggregators": aggregators})
        share = {
            name: flags.filter(pl.col("step").is_between(*steps))["fans_out"].mean()
            for name, steps in (("first", first_steps), ("last", last_steps))
        }
        lines.append(f"Training rollouts that fanned out and aggregated: {share['first']:.3f} of the first quarter's, "
                     f"{share['last']:.3f} of the last quarter's.")
    checkpoint = latest_metadata(instance, "conductor_checkpoint") or {}
    curves = checkpoint.get("curves_path")
    return "\n".join(lines), Path(str(curves.value)) if curves is not None else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--home", type=Path, help="the run's DAGSTER_HOME (default $DAGSTER_HOME)")
    parser.add_argument("--curves", type=Path, help="copy the training run's curves here")
    args = parser.parse_args(argv)
    instance = dg.DagsterInstance.from_config(str(args.home)) if args.home else dg.DagsterInstance.get()
    with instance:
        text, curves = section(args.pool, instance)
    print(text)
    if args.curves and curves is not None:
        shutil.copyfile(curves, args.curves)
        print(f"\n(curves: {args.curves})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
