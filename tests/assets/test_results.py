"""The README's results block is the recorded run's, and the record is what the code produces.

The default suite renders `docs/results/default-run.json` again and compares it with the README's
marked block, so neither can be edited alone. The slow test runs the whole default graph in a
folder of its own and compares its figures with the record: a change to the code that moves a
figure fails it until `make run && make results` records the new run.
"""

from __future__ import annotations

import json

import dagster as dg
import pytest

from assets.results import (
    BEGIN,
    END,
    README_PATH,
    RECORD_PATH,
    eval_tables_event,
    readme_block,
    record_from_instance,
    render_block,
    replace_block,
)
from conductor_pipeline.reproducibility import cpu_signature
from tests.reliability.main_runs import DEFAULT_RUN, RunFolder, run_to_end

# Figures of the record a fresh run must reproduce: all but the commit and the CPU it was made on
# (the test runs only on the record's CPU).
NOT_REPRODUCED = ("commit", "cpu")
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


def test_the_readme_block_is_the_recorded_runs() -> None:
    record = json.loads(RECORD_PATH.read_text())
    assert readme_block(README_PATH.read_text()) == render_block(record), "run `make results` after `make run`"


def test_the_block_names_the_commit_the_eval_run_and_every_conductor_pair() -> None:
    record = json.loads(RECORD_PATH.read_text())
    block = render_block(record)
    assert record["commit"] in block and record["eval_run_id"] in block
    trained = [p for p in record["conductor_pairs"] if "warm_start" not in p["arm"] and "@shuffled" not in p["arm"]]
    for pair in trained:
        if f"`{pair['reference']}`" in block:
            assert f"{100 * pair['difference']:+.1f} [" in block


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
