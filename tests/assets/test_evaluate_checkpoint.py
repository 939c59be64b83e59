"""A checkpoint trained on one pool is evaluated on another pool file, prompted as it was trained."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.definitions import build_definitions
from assets.evaluate_checkpoint import NoTrainedConductor, checked_pool, evaluate_checkpoint, main, trained_run_tags
from assets.metadata import latest_metadata
from conductor_pipeline.conductor.prompt import TRAINED_PROMPT_FILE, PromptSpec, read_trained_prompt, write_trained_prompt
from conductor_pipeline.files import DamagedArtifactError
from conductor_pipeline.paths import POOLS_DIR
from conductor_pipeline.pools.config import PoolConfigError
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.warehouse import Warehouse
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

TRAINED = PromptSpec(naming="ordinal", n_examples=0, max_new_tokens=24, temperature=1.0)
SMALL = {
    "probe_calls": {"max_questions": 60},
    "eval_arms": {"world_model_router": False, "w_cascade": False, "vote_arms": False},
}


def test_a_checkpoint_folder_records_its_training_prompt_and_its_run_folder_does_for_its_checkpoints(tmp_path):
    run = tmp_path / "grpo" / "run-1"
    write_trained_prompt(run, TRAINED)
    assert read_trained_prompt(run / "checkpoint-24") == TRAINED  # a checkpoint-N reads its run's record
    assert read_trained_prompt(tmp_path / "elsewhere") is None
    # A record from before a field existed reads with that field's default; one this code cannot read is named.
    (run / TRAINED_PROMPT_FILE).write_text('{"naming": "names", "n_examples": 0, "max_new_tokens": 80, "temperature": 1.0}')
    assert read_trained_prompt(run) == PromptSpec(naming="names", n_examples=0, max_new_tokens=80)
    (run / TRAINED_PROMPT_FILE).write_text('{"naming": "emoji"}')
    with pytest.raises(DamagedArtifactError, match=f"{TRAINED_PROMPT_FILE}: not a training prompt"):
        read_trained_prompt(run)


def test_a_checkpoint_is_evaluated_on_a_pool_file_it_was_not_trained_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train",
                        "zeroeval_outputs")
    pool = yaml.safe_load((POOLS_DIR / "replay-mixed6.yaml").read_text())
    pool["name"], pool["workers"] = "mixed6-reversed", pool["workers"][::-1]
    pool_file = tmp_path / "mixed6-reversed.yaml"
    pool_file.write_text(yaml.safe_dump(pool))
    checkpoint = build_tiny_causal_lm(tmp_path / "run" / "checkpoint-3")
    write_trained_prompt(checkpoint.parent, TRAINED)
    project = build_definitions(str(pool_file))
    defs = dg.Definitions(
        assets=project.assets, asset_checks=project.asset_checks, jobs=project.jobs,
        resources={
            **project.resources,
            "warehouse": WarehouseResource(database=str(tmp_path / "warehouse.duckdb")),
            "pool": PoolResource(pool=str(pool_file)),
            "conductor": ConductorPolicyResource(max_new_tokens=1024, n_examples=4),  # not how it was trained
        },
    )
    with dg.DagsterInstance.ephemeral() as instance:
        report = evaluate_checkpoint(defs, instance, checkpoint, tags={}, slice_size=6, op_config=SMALL, out=lambda _: None)
        assert not report.failed
        arms = latest_metadata(instance, "eval_arms")
        assert {"conductor:hf:checkpoint-3", "conductor:hf:checkpoint-3@shuffled"} <= set(arms["arms"].value)
        # Prompted and sampled exactly as the record says (fields it predates take their defaults).
        assert arms["conductor_prompts"].value["hf:checkpoint-3"] == {"model": str(checkpoint), **TRAINED.model_dump()}
        assert "conductor_pairs" in latest_metadata(instance, "eval_tables")
    catalogues = Warehouse(tmp_path / "warehouse.duckdb").query(
        "SELECT catalogue FROM workflows WHERE arm = 'conductor:hf:checkpoint-3'"
    )["catalogue"].to_list()
    assert catalogues and all(list(c) == [w["name"] for w in pool["workers"]] for c in catalogues)


def _pool_file(tmp_path: Path, edit) -> Path:
    pool = yaml.safe_load((POOLS_DIR / "replay-test-six.yaml").read_text())
    edit(pool["workers"])
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(pool))
    return path


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda workers: workers[2].update(model="gemini-9-ultra"), r"gemini-1\.5-flash \(model 'gemini-9-ultra'\)"),
        (lambda workers: workers[1].update(description="  "), r"workers\[1\] \(worker 'claude-3-haiku'\)\.description: Value error, blank"),
        (lambda workers: workers[3].update(name=workers[0]["name"]), r"repeated: \['gpt-4o-mini'\]"),
    ],
    ids=["no recordings", "blank description", "duplicate name"],
)
def test_a_pool_file_that_cannot_be_evaluated_is_refused_naming_the_file_and_worker_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, edit, named
):
    require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))  # nothing may be created there
    path = _pool_file(tmp_path, edit)
    with pytest.raises(PoolConfigError, match=named) as refused:
        checked_pool(str(path))
    assert str(path) in str(refused.value)
    assert main(["--trained", "--pool", str(path)]) == 2
    assert str(path) in capsys.readouterr().err and not (tmp_path / "home").exists()
    checked_pool("replay-test-six")  # the shipped pool is fine


def test_the_trained_conductor_is_found_by_its_seed_and_named_when_missing(tmp_path: Path):
    @dg.asset(name="conductor_checkpoint")
    def trained() -> None:
        return None

    with dg.DagsterInstance.ephemeral() as instance:
        with pytest.raises(NoTrainedConductor, match="no trained conductor of seed 3 in .*gate closed"):
            trained_run_tags(instance, 3)
        # A run with an eval-only settings file trained the profile's recipe: its eval on another
        # pool reads that training too, so it carries the trained recipe with the recipe and seed.
        tags = {"recipe": "cpu+larger-slice", "trained_recipe": "cpu", "seed": "3", "pool": "replay-mixed6"}
        assert dg.materialize([trained], instance=instance, tags=tags).success
        assert trained_run_tags(instance, 3) == {"recipe": "cpu+larger-slice", "trained_recipe": "cpu", "seed": "3"}
    with pytest.raises(SystemExit):  # a folder and --trained together are refused
        main(["ckpt", "--trained"])
