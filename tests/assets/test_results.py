"""The README's results block is the recorded run's, and the record is what the code produces.

The default suite renders `docs/results/default-run.json` again and compares it with the README's
marked block, so neither can be edited alone. The slow test runs the whole default graph in a
folder of its own and compares its figures with the record: a change to the code that moves a
figure fails it until `make run && make results` records the new run.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl
import pytest

from assets.deployment import QUICK_EVAL_TAG
from assets.results import (
    BEGIN,
    END,
    README_PATH,
    RECORD_PATH,
    eval_tables_event,
    against_the_record,
    readme_block,
    record_from_instance,
    render_block,
    replace_block,
    seeds_summary,
    summary_text,
)
from conductor_pipeline.reproducibility import cpu_signature
from tests.reliability.main_runs import DEFAULT_RUN, RunFolder, run_to_end

# Figures of the record a fresh run must reproduce: all but the commit and the CPU it was made on
# (the test runs only on the record's CPU), and what `make seeds` adds (the other seeds' runs).
NOT_REPRODUCED = ("commit", "cpu", "recipe", "seeds", "spread", "pooled", "pool", "unseen_pool", "missing_trained")
TRAINED = "conductor:hf:checkpoint-120"
# Significant digits a reproduced float must match: two fresh runs of the same commit agree on every
# figure but the last bits of the warm start's chi-square p-value (0.5450404161506501 and ...504).
REPRODUCED_DIGITS = 12


def _to_digits(value: object) -> object:
    """`value` (the record's JSON) with every float rounded to REPRODUCED_DIGITS significant digits."""
    if isinstance(value, float):
        return float(f"{value:.{REPRODUCED_DIGITS}g}")
    if isinstance(value, dict):
        return {key: _to_digits(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_digits(item) for item in value]
    return value


def test_the_eval_of_a_pool_is_found_past_later_evals_on_other_pool_files() -> None:
    """A checkpoint evaluated on held-out pool files in the same instance writes later `eval_tables`
    materializations; the report on the training pool must still read that pool's eval."""

    @dg.asset(name="eval_tables")
    def eval_tables(context) -> dg.MaterializeResult:  # unannotated: Dagster refuses the string annotation here
        return dg.MaterializeResult(metadata={"run_id": context.run.tags["pool"]})

    with dg.instance_for_test() as instance:
        for pool in ("replay-mixed6-vote", "heldout-a.yaml", "heldout-b.yaml"):
            assert dg.materialize([eval_tables], instance=instance, tags={"pool": pool}).success
        found = {pool: eval_tables_event(instance, pool).asset_materialization.metadata["run_id"].value
                 for pool in ("replay-mixed6-vote", "heldout-a.yaml")}
        assert found == {"replay-mixed6-vote": "replay-mixed6-vote", "heldout-a.yaml": "heldout-a.yaml"}
        assert eval_tables_event(instance).asset_materialization.metadata["run_id"].value == "heldout-b.yaml"
        with pytest.raises(SystemExit, match="replay-mixed6'"):
            eval_tables_event(instance, "replay-mixed6")


def write_seed_tables(folder: Path, run_id: str, trained_gain: int, seed: int) -> dict[str, object]:
    """The eval tables `record_from_event` and `seeds_summary` read, for a run whose trained arm
    solves `trained_gain` more of 200 questions than the best single worker; its metadata."""
    rng = np.random.default_rng(seed)
    reference = (rng.random(200) < 0.5).astype(float)
    trained = reference.copy()
    trained[np.flatnonzero(reference == 0)[:trained_gain]] = 1.0
    scores = {"best_single": reference, TRAINED: trained, "random": (rng.random(200) < 0.3).astype(float)}
    pl.DataFrame([{"arm": arm, "question_id": f"q{i}", "score": float(v)} for arm, values in scores.items()
                  for i, v in enumerate(values)]).write_parquet(folder / f"{run_id}_question_scores.parquet")
    pl.DataFrame({"arm": list(scores), "accuracy": [float(v.mean()) for v in scores.values()],
                  "parse_ok_share": [1.0] * 3}).write_parquet(folder / f"{run_id}_arms.parquet")
    pl.DataFrame({"arm": [TRAINED] * 2, "reference": ["best_single", "random"], "difference": [0.0, 0.0],
                  "difference_low": [0.0, 0.0], "difference_high": [0.0, 0.0], "verdict": ["ties", "ties"]}
                 ).write_parquet(folder / f"{run_id}_conductor_pairs.parquet")
    pl.DataFrame({"arm": [TRAINED], "same_final_worker": [1.0], "both_parsed": [200]}).write_parquet(
        folder / f"{run_id}_order_agreement.parquet")
    return {"run_id": run_id, "tables_dir": str(folder), "n_scored": 200}


def test_the_seed_summary_pools_the_latest_eval_of_each_seed_of_the_recipe(tmp_path: Path) -> None:
    @dg.asset(name="eval_tables")
    def eval_tables(context) -> dg.MaterializeResult:  # unannotated: Dagster refuses the string annotation here
        tags = context.run.tags
        return dg.MaterializeResult(metadata=write_seed_tables(
            tmp_path, tags["run_key"], int(tags["gain"]), int(tags["seed"])))

    @dg.asset(name="warm_start_policy")
    def warm_start_policy(context) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"parse_rate_after": int(context.run.tags["gain"]) / 100})

    runs = [  # (recipe, seed, gain, quick): the second seed-0 run is the latest full one; another recipe's
        # runs and a quick eval (the conductor alone, no warm start or twin) stay out of the record
        ("cpu", "0", 5, False), ("cpu", "1", 30, False), ("cpu", "2", 24, False), ("cpu", "0", 20, False),
        ("cpu+other", "0", 7, False), ("cpu+other", "1", 0, False), ("cpu", "0", 40, True), ("cpu", "1", 40, True),
    ]
    with dg.instance_for_test() as instance:
        for i, (recipe, seed, gain, quick) in enumerate(runs):
            tags = {"pool": "replay-mixed6", "recipe": recipe, "seed": seed, "gain": str(gain), "run_key": f"eval-{i}",
                    "cpu": "Some CPU (avx2)", "git_commit": "abc", **({QUICK_EVAL_TAG: "true"} if quick else {})}
            assets = [eval_tables] if quick else [warm_start_policy, eval_tables]  # a quick eval trains nothing
            assert dg.materialize(assets, instance=instance, tags=tags).success
        summary = seeds_summary(instance, "replay-mixed6", "cpu")
        seed_0 = record_from_instance(instance, "replay-mixed6", {"recipe": "cpu", "seed": "0"})
        # The warm start behind seed 0's eval is its own recipe's seed 0's, not a later run's of another
        # recipe (seed 0 or 1).
        assert seed_0["eval_run_id"] == "eval-3" and seed_0["warm_start"]["parse_rate_after"] == 0.20
        # An eval-only settings file's eval (its own recipe name) trained nothing: behind it is the
        # profile's seed 0 training, not the newer seed 0 training of another recipe.
        eval_only = {"pool": "replay-mixed6", "recipe": "cpu+larger-slice", "trained_recipe": "cpu", "seed": "0",
                     "gain": "9", "run_key": "eval-only", "cpu": "Some CPU (avx2)", "git_commit": "abc"}
        assert dg.materialize([eval_tables], instance=instance, tags=eval_only).success
        larger = record_from_instance(instance, "replay-mixed6", {"recipe": "cpu+larger-slice", "seed": "0"})
        assert larger["eval_run_id"] == "eval-only" and larger["warm_start"]["parse_rate_after"] == 0.20
    assert [(run["seed"], run["eval_run_id"], run["cpu"]) for run in summary["seeds"]] == [
        (0, "eval-3", "Some CPU (avx2)"), (1, "eval-1", "Some CPU (avx2)"), (2, "eval-2", "Some CPU (avx2)")]
    assert summary["spread"][TRAINED]["min"] < summary["spread"][TRAINED]["max"]
    assert summary["spread"]["best_single"]["min"] < summary["spread"]["best_single"]["max"]  # seeded per run here
    pooled = {(row["arm"], row["reference"]): row for row in summary["pooled"]}
    assert set(pooled) == {(TRAINED, "best_single"), (TRAINED, "random")}
    versus_best = pooled[(TRAINED, "best_single")]
    assert versus_best["seeds"] == [0, 1, 2] and versus_best["difference"] == pytest.approx((20 + 30 + 24) / 600)
    assert versus_best["verdict"] == "beats" and versus_best["per_seed_verdict"] == ["beats"] * 3
    assert versus_best["p_holm"] >= versus_best["p_value"]
    assert "seed 1 on Some CPU (avx2) at abc" in summary_text(summary)
    json.dumps(summary)  # what `make seeds` writes


def test_a_run_is_checked_against_the_recorded_seeds_spread() -> None:
    # Four seed runs, one of whose gates closed: the spread is over the three that trained the arm.
    trained_seed = {"arms": {TRAINED: {"accuracy": 0.47, "parsed": 1.0}}}
    record = {"seeds": [trained_seed, trained_seed, {"arms": {"random": {"accuracy": 0.4, "parsed": 1.0}}}, trained_seed],
              "spread": {TRAINED: {"min": 0.451, "max": 0.484, "mean": 0.466, "std": 0.02}}}
    inside = against_the_record(record, {TRAINED: {"accuracy": 0.461}, "conductor:hf:warm_start": {"accuracy": 0.3}})
    assert inside == [f"{TRAINED}: 0.461, inside the recorded 3 seeds' [0.451, 0.484] (docs/results/default-run.json)"]
    assert "OUTSIDE" in against_the_record(record, {TRAINED: {"accuracy": 0.50}})[0]
    assert against_the_record(record, {"conductor:hf:checkpoint-7": {"accuracy": 0.5}}) == []


def test_the_recorded_seeds_keep_their_contract() -> None:
    """Reviewers read `seeds` from the record: one object per seed run with its seed, CPU and arms."""
    record = json.loads(RECORD_PATH.read_text())
    assert len(record["seeds"]) >= 3
    for run in record["seeds"]:
        assert isinstance(run["seed"], int) and isinstance(run["cpu"], str) and run["cpu"]
        assert all(set(figures) >= {"accuracy", "parsed"} for figures in run["arms"].values())
    assert len({run["seed"] for run in record["seeds"]}) == len(record["seeds"])
    assert all(row["seeds"] == sorted(row["seeds"]) for row in record["pooled"])


def test_the_readme_block_is_the_recorded_runs() -> None:
    record = json.loads(RECORD_PATH.read_text())
    assert readme_block(README_PATH.read_text()) == render_block(record), "run `make results` after `make run`"


def test_the_block_names_the_commit_the_machines_the_test_and_every_pooled_verdict() -> None:
    record = json.loads(RECORD_PATH.read_text())
    block = render_block(record)
    assert record["commit"] in block and record["eval_run_id"] in block
    assert f"{len(record['seeds'])} seeds" in block and "Holm-adjusted" in block
    assert all(run["cpu"] in block for run in record["seeds"])
    for pair in record["pooled"]:
        assert f"{100 * pair['difference']:+.1f} [{100 * pair['difference_low']:+.1f}" in block, pair
        assert pair["verdict"] in block


def test_the_block_shows_the_pool_of_workers_the_conductor_never_saw_with_its_verdicts() -> None:
    record = json.loads(RECORD_PATH.read_text())
    unseen = record["unseen_pool"]
    block = render_block(record)
    assert f"On `{unseen['pool']}`, test models" in block and unseen["eval_run_id"] in block
    assert {"w_router", "random", "best_single"} <= {pair["reference"] for pair in unseen["pooled"]}
    for pair in unseen["pooled"]:
        if "@" not in pair["arm"] and pair["reference"] in ("random", "w_router"):
            assert f"| `{pair['reference']}` |" in block.split(unseen["pool"], 1)[1]
            assert f"{100 * pair['difference']:+.1f} [{100 * pair['difference_low']:+.1f}" in block, pair
    assert render_block({**record, "unseen_pool": None}).count("| arm |") == 1  # an older record: one table


def test_replacing_the_block_keeps_the_rest_of_the_readme() -> None:
    readme = f"# title\n\nbefore\n{BEGIN}\nold figures\n{END}\nafter\n"
    replaced = replace_block(readme, "new figures")
    assert replaced == f"# title\n\nbefore\n{BEGIN}\nnew figures\n{END}\nafter\n"
    assert readme_block(replaced) == "new figures"
    with pytest.raises(ValueError, match="results:begin"):
        replace_block("# no block here\n", "figures")


@pytest.mark.slow
def test_a_fresh_default_run_reproduces_the_record(tmp_path, default_run_data: None) -> None:
    recorded = json.loads(RECORD_PATH.read_text())
    if recorded.get("cpu", "unknown") not in ("unknown", cpu_signature()):
        pytest.skip(f"recorded on {recorded['cpu']}, this machine is {cpu_signature()}: other float kernels, other figures")
    folder = RunFolder(tmp_path).prepare()
    run_to_end(folder, DEFAULT_RUN, tmp_path / "run.log")
    with dg.DagsterInstance.from_config(str(folder.home)) as instance:
        fresh = record_from_instance(instance)
    for key in NOT_REPRODUCED:
        fresh.pop(key, None), recorded.pop(key, None)
    assert _to_digits(json.loads(json.dumps(fresh))) == _to_digits(recorded)
