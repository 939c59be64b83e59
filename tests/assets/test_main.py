"""`make run` tells a closed gate (a result) from a broken step (a fault), and every headline it
prints is an entry its asset really publishes."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._utils.error import SerializableErrorInfo

from assets.dagster_internals import StaleStatus, stale_status_resolver
from assets.definitions import build_definitions
from assets.main import (
    HEADLINES,
    check_settings_ops,
    is_blocking_check_failure,
    main,
    plan_job,
    print_headlines,
    raised_by_the_step,
    run_main_jobs,
)
from assets.metadata import latest_metadata
from assets.probing import PROBE_CALLS, all_probe_partitions_tags
from assets.run_settings import RunSettings, RunSettingsError, load_run_settings
from assets.versions import with_code_versions
from conductor_pipeline.paths import DATA_DIR
from conductor_pipeline.training.gates import evaluate_zero_variance, write_verdict
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from resources.conductor import ConductorPolicyResource
from resources.trainer import TrainerResource
from tests.shared_data import require_shared_data

POOL = "replay-mixed6"
# A whole run at toy sizes: a 60-question probe slice, a pool search over 200 questions, 2 GRPO steps
# of 2 questions x 4 rollouts, a 4-question eval slice, a world model on 2 x 2 folds.
TOY_TRAINER = dict(num_generations=4, questions_per_step=2, max_completion_length=24, probe_steps=1, max_steps=1,
                   save_steps=10, sft_warm_start=False)
FAST_WORLD_MODEL = {"num_threads": 1, "text_components": 8, "question_folds": 2, "worker_folds": 2, "n_bootstrap": 10}
OP_CONFIG = {
    "probe_calls": {"max_questions": 60},
    "contested_set": {"min_size": 1},
    "pool_search": {"max_questions": 200, "n_bootstrap": 50},
    "world_model": FAST_WORLD_MODEL,
    "world_model_report": FAST_WORLD_MODEL,
    "eval_arms": {"slice_size": 4, "world_model": {"num_threads": 1}},
}
TRAINING_ONLY_JOB = "conductor_checkpoint_only"


def error(cls_name: str, cause: SerializableErrorInfo | None = None) -> SerializableErrorInfo:
    return SerializableErrorInfo(message=f"{cls_name}: boom", stack=[], cls_name=cls_name, cause=cause)


def test_a_failed_blocking_check_is_a_gate_not_a_fault():
    assert is_blocking_check_failure(error("DagsterAssetCheckFailedError"))
    assert is_blocking_check_failure(error("DagsterExecutionStepExecutionError", error("DagsterAssetCheckFailedError")))


def test_any_other_step_error_is_a_fault():
    assert not is_blocking_check_failure(error("ValueError"))
    assert not is_blocking_check_failure(error("DagsterExecutionStepExecutionError", error("KeyError")))


def test_a_failed_step_is_reported_by_the_error_its_op_raised_not_dagsters_wrapper():
    raised = error("ArtifactWriteError", error("ComputeError"))  # what the op raised, and what it was raised from
    assert raised_by_the_step(error("DagsterExecutionStepExecutionError", raised)) is raised
    assert raised_by_the_step(error("Failure")).cls_name == "Failure"


def run_job(defs: dg.Definitions, name: str, instance: dg.DagsterInstance, **options) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def(name)
    ops = {op: {"config": config} for op, config in OP_CONFIG.items() if job.graph.has_node_named(op)}
    return job.execute_in_process(instance=instance, run_config={"ops": ops}, raise_on_error=False, **options)


def open_gate_for_latest_probe(instance: dg.DagsterInstance, trainer: TrainerResource) -> None:
    """The verdict the gate writes when the probe shows a gradient, for the probe just run.

    The untrained toy policy never writes a parseable workflow, so its own probe closes the gate.
    """
    probe_run_id = latest_metadata(instance, "grpo_probe_run")["probe_run_id"].value
    verdict = evaluate_zero_variance([{"frac_zero_std": 0.0}], probe_run_id=probe_run_id,
                                     group_size=TOY_TRAINER["num_generations"],
                                     groups_per_step=TOY_TRAINER["questions_per_step"])
    write_verdict(trainer.gate_path(POOL), verdict)


def toy_definitions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trainer: TrainerResource) -> dg.Definitions:
    """The project's definitions, code versions included, with toy resources."""
    require_shared_data(monkeypatch, tmp_path / "cache", "math500_test", "math_full", "gsm8k_test", "gsm8k_train",
                        "zeroeval_outputs")
    monkeypatch.setenv("CORYPHAEUS_WAREHOUSE", str(tmp_path / "warehouse" / "warehouse.duckdb"))
    project = build_definitions(POOL)
    resources = {**project.resources, "trainer": trainer,
                 "conductor": ConductorPolicyResource(model_path=trainer.policy_model, max_new_tokens=24, n_examples=1)}
    return dg.Definitions(
        assets=with_code_versions(project.assets, resources), asset_checks=project.asset_checks,
        jobs=[*project.jobs, dg.define_asset_job(TRAINING_ONLY_JOB, selection=["conductor_checkpoint"])],
        resources=resources,
    )


def toy_run_config(job: dg.JobDefinition, assets: list[str], **overrides: dict) -> dict:
    config = {**OP_CONFIG, **overrides}
    return {"ops": {op: {"config": config[op]} for op in assets if op in config}}


def assert_every_headline_is_published(instance: dg.DagsterInstance) -> None:
    for asset, entries in HEADLINES:
        metadata = latest_metadata(instance, asset)
        assert metadata is not None, f"{asset} was not materialized"
        missing = [entry for entry in entries if entry not in metadata]
        assert not missing, f"{asset} publishes no {missing} (it publishes {sorted(metadata)})"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_headlines(instance, POOL)
    for asset, entries in HEADLINES:
        assert f"### {asset}\n" in printed.getvalue()
        for entry in entries:
            assert f"\n{entry}:" in printed.getvalue(), (asset, entry)


def test_a_toy_run_publishes_every_headline_a_rerun_recomputes_nothing_and_a_change_exactly_what_depends_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One toy default run serves both questions: it is the suite's costliest fixture (20 s)."""
    tiny = build_tiny_causal_lm(tmp_path / "tiny")
    trainer = TrainerResource(output_root=str(tmp_path / "training"), policy_model=str(tiny), **TOY_TRAINER)
    defs = toy_definitions(tmp_path, monkeypatch, trainer)
    with dg.DagsterInstance.ephemeral() as instance:
        first = run_main_jobs(defs, instance, run_config=toy_run_config, out=lambda line: None)
        assert not first.failed
        assert first.gated, "the toy policy closes the gate"

        # Opened by hand, the gate lets the checkpoint train; the eval then reads a trained policy.
        open_gate_for_latest_probe(instance, trainer)
        assert run_job(defs, TRAINING_ONLY_JOB, instance).success
        after_training = run_main_jobs(defs, instance, run_config=toy_run_config, out=lambda line: None)
        assert not after_training.failed and "eval_arms" in after_training.materialized
        assert_every_headline_is_published(instance)

        lines: list[str] = []
        second = run_main_jobs(defs, instance, run_config=toy_run_config, out=lines.append)
        assert second.materialized == [], lines
        assert {name for plan in second.plans for name in plan.held} <= {"conductor_checkpoint"}
        assert any("nothing to do" in line for line in lines)
        resolver = stale_status_resolver(defs, instance)
        assert resolver.get_status(dg.AssetKey("pass_rates")) == StaleStatus.FRESH  # what the UI shows

        # A changed setting: a trainer knob makes the training assets stale, nothing upstream of them.
        reseeded = toy_definitions(tmp_path, monkeypatch, trainer.model_copy(update={"seed": 1}))
        plan = plan_job(reseeded, instance, "analysis_job")
        assert set(plan.run) == {"warm_start_policy", "grpo_probe_run", "conductor_checkpoint"}
        assert "pass_rates" in plan.fresh and "world_model" in plan.fresh
        assert all("code version" in plan.run[name] for name in ("warm_start_policy",))
        assert plan_job(reseeded, instance, "eval_job").run == {}, "eval waits until what it reads has changed"

        # A new probe sample: pass rates and everything that reads them go stale; the pool search does not.
        more = toy_run_config(defs.resolve_job_def("probe_job"), [PROBE_CALLS], probe_calls={"max_questions": 70})
        tags = all_probe_partitions_tags(defs.get_assets_def(PROBE_CALLS).partitions_def)
        assert defs.resolve_job_def("probe_job").execute_in_process(instance=instance, run_config=more, tags=tags).success
        assert plan_job(defs, instance, "probe_job").run == {}, "probe_calls itself is as fresh as its new rows"
        assert stale_status_resolver(defs, instance).get_status(dg.AssetKey("pass_rates")) == StaleStatus.STALE
        plan = plan_job(defs, instance, "analysis_job")
        assert "new dependency data version" in plan.run["pass_rates"]
        assert set(plan.run) >= {"pass_rates", "oracle_ceilings", "contested_set", "world_model", "world_model_report"}
        assert "pool_search" in plan.fresh

        third = run_main_jobs(defs, instance, run_config=toy_run_config, out=lambda line: None)
        assert not third.failed
        assert "pass_rates" in third.materialized and "eval_arms" in third.materialized
        assert "questions" not in third.materialized and "pool_search" not in third.materialized
        assert run_main_jobs(defs, instance, run_config=toy_run_config, out=lambda line: None).materialized == []


@pytest.mark.parametrize("recipe", sorted((DATA_DIR / "train-paper").glob("*.yaml")), ids=lambda p: p.stem)
def test_each_shipped_paper_budget_recipe_is_a_valid_cpu_paper_trainer(recipe: Path) -> None:
    """`make train-paper CONFIG=data/train-paper/FILE` must not fail on its settings after the
    minutes of setup it runs first, and must keep the paper's budget."""
    trained = TrainerResource(profile="cpu-paper", **load_run_settings(recipe).resource("trainer")).recipe()
    settings = trained.grpo
    assert settings.rollouts_per_step * settings.max_steps == 51_200
    assert trained.prompt.constrained_decoding == settings.constrained_decoding
    assert trained.prompt.fan_outs_only == settings.fan_outs_only
    check_settings_ops(build_definitions(POOL), load_run_settings(recipe))


@pytest.mark.parametrize(
    ("ops", "refusal"),
    [
        ({"contested_sets": {"corpora": ["math"]}}, "ops.contested_sets is not an asset `make run` materializes"),
        ({"contested_set": {"corpus": ["math"]}}, 'ops.contested_set: Received unexpected config entry "corpus"'),
        ({"contested_set": {"corpora": "math"}}, "corpora must be list"),
    ],
)
def test_op_settings_that_no_asset_would_apply_are_refused_before_anything_runs(
    tmp_path: Path, ops: dict, refusal: str
) -> None:
    settings_file = tmp_path / "recipe.yaml"
    settings_file.write_text(yaml.safe_dump({"ops": ops}))
    with pytest.raises(RunSettingsError, match="recipe.yaml") as refused:
        check_settings_ops(build_definitions(POOL), load_run_settings(settings_file))
    assert refusal in str(refused.value)


def test_make_run_refuses_a_misspelt_op_before_it_opens_the_artifacts_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    artifacts = tmp_path / "artifacts"
    monkeypatch.setenv("CORYPHAEUS_ARTIFACTS", str(artifacts))
    settings_file = tmp_path / "recipe.yaml"
    settings_file.write_text(yaml.safe_dump({"ops": {"contested_sets": {"corpora": ["math"]}}}))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert main(["--pool", POOL, "--config", str(settings_file)]) == 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert "recipe.yaml: ops.contested_sets is not an asset" in capsys.readouterr().err
    assert not artifacts.exists(), "nothing may be written before the settings are accepted"


def test_the_entry_point_exits_with_mains_status_and_leaves_the_last_collection_out() -> None:
    """`cli` exits with `main`'s status; the modules imported before `main` and everything `main`
    left are frozen by the time atexit handlers run, so the interpreter's last collection skips them."""
    probe = (
        "import atexit, gc, sys\n"
        "import assets.main\n"
        "seen = {}\n"
        "def fake_main():\n"
        "    seen['imports_frozen'] = gc.get_freeze_count()\n"
        "    seen['left'] = [[] for _ in range(10_000)]\n"
        "    return 3\n"
        "assets.main.main = fake_main\n"
        "atexit.register(lambda: print('frozen:', seen['imports_frozen'] > 0,\n"
        "                              gc.get_freeze_count() >= seen['imports_frozen'] + 9_000))\n"
        "assets.main.cli()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 3, done.stderr
    assert "frozen: True True" in done.stdout


def test_a_seed_is_a_trainer_setting_and_a_recipe_is_the_profile_and_the_settings_files_name(tmp_path: Path) -> None:
    settings_file = tmp_path / "fan-outs.yaml"
    settings_file.write_text(yaml.safe_dump({"resources": {"trainer": {"max_steps": 7}}}))
    settings = load_run_settings(settings_file)
    reseeded = settings.with_resource("trainer", seed=3)
    assert reseeded.resource("trainer") == {"max_steps": 7, "seed": 3} and settings.resource("trainer") == {"max_steps": 7}
    assert reseeded.recipe("cpu-paper") == "cpu-paper+fan-outs"
    assert RunSettings().recipe("cpu") == "cpu"
    # A file that sets only the eval names its recipe, but trains the profile's (a seed is not a recipe).
    assert reseeded.trained_recipe("cpu-paper") == "cpu-paper+fan-outs"
    eval_only = tmp_path / "larger-slice.yaml"
    eval_only.write_text(yaml.safe_dump({"ops": {"eval_arms": {"slice_size": 768}},
                                         "resources": {"conductor": {"n_examples": 0}}}))
    larger = load_run_settings(eval_only).with_resource("trainer", seed=2)
    assert larger.recipe("cpu") == "cpu+larger-slice" and larger.trained_recipe("cpu") == "cpu"
    assert RunSettings().trained_recipe("cpu") == "cpu"
    defs = build_definitions(POOL, reseeded)
    assert defs.resources["trainer"].seed == 3


def test_the_headlines_are_the_pools_own_and_a_run_without_a_pool_tag_counts_for_any_pool() -> None:
    """An instance that evaluated other pool files holds their eval tables under the same asset key."""

    def materialize(asset: str, text: str, tags: dict[str, str]) -> None:
        @dg.asset(name=asset)
        def headline() -> dg.MaterializeResult:
            return dg.MaterializeResult(metadata={"conductor_vs_best_single": text, "total_rows": text})

        assert dg.materialize([headline], instance=instance, tags=tags).success

    def printed(pool: str) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_headlines(instance, pool)
        return out.getvalue()

    with dg.DagsterInstance.ephemeral() as instance:
        materialize("eval_tables", "default pool's", {"pool": POOL})
        materialize("eval_tables", "test pool's", {"pool": "replay-test-four"})
        materialize("questions", "every pool's", {"pool": "replay-test-four"})
        assert "default pool's" in printed(POOL) and "test pool's" not in printed(POOL)
        assert "every pool's" in printed(POOL)
        assert "test pool's" in printed("replay-test-four")
        assert "eval_tables" not in printed("replay-test-six")
        materialize("eval_tables", "the UI's", {})
        assert "the UI's" in printed(POOL) and "the UI's" in printed("replay-test-six")
