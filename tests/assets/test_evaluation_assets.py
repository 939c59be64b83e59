"""eval_arms + eval_tables on a 30-question slice of replay-mixed6 in a tmp warehouse, with the
tiny local HF conductor (random weights: the weak arm; shown W's predictions), the W-router and
W-cascade arms and their train-split-only W, the vote arms, every arm paired against the best
single worker, the conductor check warning, and the leak check failing on a leak."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets.definitions import build_definitions
from assets.evaluation import EVALUATION_ASSETS, EVALUATION_CHECKS, eval_slice_has_no_leak
from assets.evaluation_config import EvalArmsConfig
from assets.evaluation_inputs import probe_ceilings, questions_seen_in_training, world_model_routing
from assets.metadata import latest_metadata_value
from assets.world_model import WorldModelFitConfig
from conductor_pipeline.corpora.loaders import load_math_full
from conductor_pipeline.evaluation.arms import EvalRunSummary
from conductor_pipeline.evaluation.lineup import eval_run_id
from conductor_pipeline.evaluation.routing_predictions import RoutingPredictions
from conductor_pipeline.paths import artifacts_root
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.probing.runner import run_probes
from conductor_pipeline.records import CallRecord, stable_id
from conductor_pipeline.splits import split_of
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.world_model.model import fit_train_split_world_model
from conductor_pipeline.world_model.persistence import load_world_model
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

SLICE = 30
CALIBRATION_QUESTIONS = 40
POOL = "replay-mixed6"
RECURSIVE_POOL = "replay-mixed6-recursive"  # the same six replay seats and the conductor itself


def probed_warehouse(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pool_name: str) -> Path:
    """A warehouse with level-5 MATH questions and the pool's train-split calibration probes."""
    require_shared_data(monkeypatch, tmp_path / "cache", "zeroeval_outputs", "math_full")
    path = tmp_path / "warehouse.duckdb"
    store = Warehouse(path)
    level5 = [q for q in load_math_full() if q.split == "test" and q.level == 5]
    store.insert("questions", level5)
    pool = load_pool(pool_name)
    workers = build_workers(pool, [s.name for s in pool.workers if not s.is_conductor])
    covered = set.intersection(*(set(w.question_ids) for w in workers.values()))
    calibration = [q for q in level5 if q.question_id in covered and split_of(q.question_id) == "train"]
    asyncio.run(
        run_probes(
            store, pool, workers, calibration[:CALIBRATION_QUESTIONS], samples=1, temperature=0.2,
            run_id="probe-test", governor=Governor.from_pool(pool), only_recorded=True,
        )
    )
    return path


@pytest.fixture
def warehouse_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    return probed_warehouse(monkeypatch, tmp_path, POOL)


def materialize(path: Path, tiny: Path, selection: list) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        selection,
        resources={
            "warehouse": WarehouseResource(database=str(path)),
            "pool": PoolResource(pool=POOL),
            "conductor": ConductorPolicyResource(
                model_path=str(tiny), max_new_tokens=24, n_examples=1, show_predicted_success=True
            ),
        },
        run_config={
            "ops": {"eval_arms": {"config": {"slice_size": SLICE, "repeats": 1, "world_model": {"num_threads": 1}}}}
        },
    )


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    (event,) = result.asset_materializations_for_node(asset)
    return {key: value.value for key, value in event.metadata.items()}


def test_eval_arms_and_tables_on_a_30_question_slice(warehouse_path: Path, tmp_path: Path) -> None:
    tiny = build_tiny_causal_lm(tmp_path / "tiny")
    result = materialize(warehouse_path, tiny, [*EVALUATION_ASSETS, *EVALUATION_CHECKS])
    assert result.success  # the conductor check below warns; it never fails the run
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    check = checks["eval_slice_has_no_leak"]
    assert check.passed
    # The random-weight conductor writes no workflow: its verdict is "loses", so the check is red.
    conductor_check = checks["conductor_beats_best_single"]
    assert conductor_check.passed is False and conductor_check.severity == dg.AssetCheckSeverity.WARN
    assert conductor_check.metadata["verdicts"].value == {
        "conductor:hf:tiny+W": "loses", "conductor:hf:tiny+W@shuffled": "loses",
    }

    arms = metadata(result, "eval_arms")
    assert arms["planned_slice_size"] == SLICE and arms["slice_size"] == SLICE
    assert arms["calibration_questions"] == CALIBRATION_QUESTIONS
    # solo, baselines, the W-router, the W-cascade, three votes, two agreement cascades, the conductor
    # in pool-file and shuffled order
    assert len(arms["arms"]) == 6 + 3 + 1 + 1 + 3 + 2 + 2
    new_arms = {
        "w_router", "w_cascade@0.5", "vote:all", "vote:top3", "vote:top5", "cascade:as-vote", "cascade:half-cost",
        "conductor:hf:tiny+W", "conductor:hf:tiny+W@shuffled",
    }
    assert new_arms <= set(arms["arms"])
    # The run id hashes the settings, the arm names in order and what the arms are made of (the
    # pool's seats, the best single, the routing W's predictions, the conductor's weights and prompt).
    conductor = ConductorPolicyResource(model_path=str(tiny), max_new_tokens=24, n_examples=1, show_predicted_success=True)
    summary = result.output_for_node("eval_arms")
    routing = summary.extra["routing_predictions"]
    assert arms["run_id"] == eval_run_id(
        pool=POOL, spec=EvalArmsConfig(slice_size=SLICE).slice_spec(), repeats=1,
        split_fingerprint=arms["split_fingerprint"], include_question=True, max_depth=2, arm_names=arms["arms"],
        random_seed=0, w_router_lambda_cost=0.0,
        arm_inputs=stable_id(load_pool(POOL).model_dump_json(), "gpt-4o", routing.fingerprint(), conductor.fingerprint(),
                             *(cascade["cascade"] for cascade in arms["agreement_cascades"])),
    )
    # W refitted on the same rows predicts the same, so a rerun resumes the run; other predictions do not.
    seats = [s for s in load_pool(POOL).workers if s.name in routing.workers]
    by_id = {q.question_id: q for q in load_math_full()}
    refitted = RoutingPredictions.from_model(
        fit_train_split_world_model(Warehouse(warehouse_path), POOL, seats, WorldModelFitConfig(num_threads=1).model_settings()),
        seats, [by_id[qid] for qid in routing.question_ids], "gpt-4o",
    )
    assert refitted.fingerprint() == routing.fingerprint()
    assert dataclasses.replace(routing, success=routing.success + 0.01).fingerprint() != routing.fingerprint()
    store = Warehouse(warehouse_path)
    counts = store.query(
        "SELECT arm, count(*) AS n, count_if(infra_failure) AS infra FROM workflows WHERE run_id = $r GROUP BY arm",
        {"r": arms["run_id"]},
    )
    assert counts.height == 18 and set(counts["n"]) == {SLICE} and set(counts["infra"]) == {0}
    # Every conductor workflow records the catalogue it was shown: the pool file's order, or a
    # per-question permutation of it for the shuffled arm.
    catalogues = store.query(
        "SELECT arm, question_id, catalogue FROM workflows WHERE run_id = $r AND arm LIKE 'conductor:%'",
        {"r": arms["run_id"]},
    )
    pool_order = load_pool(POOL).worker_names
    plain = catalogues.filter(pl.col("arm") == "conductor:hf:tiny+W")["catalogue"].to_list()
    shuffled = catalogues.filter(pl.col("arm") == "conductor:hf:tiny+W@shuffled")["catalogue"].to_list()
    assert all(list(c) == pool_order for c in plain)
    assert all(sorted(c) == sorted(pool_order) for c in shuffled) and any(list(c) != pool_order for c in shuffled)
    # A vote's cost and tokens are the sums of its workers' recorded calls: six calls per question.
    votes = store.query(
        "SELECT w.workflow_id, any_value(w.cost_usd) AS cost, sum(c.cost_usd) AS call_cost, count(*) AS calls "
        "FROM workflows w JOIN calls c USING (workflow_id) WHERE w.arm = 'vote:all' AND w.run_id = $r GROUP BY ALL",
        {"r": arms["run_id"]},
    )
    assert votes.height == SLICE and set(votes["calls"]) == {6}
    assert (votes["cost"] - votes["call_cost"]).abs().max() < 1e-12 and votes["cost"].min() > 0
    # A cascade over the top five pays for the calls it made: its first stage, or all five when it escalated.
    cascades = {c["arm"]: c for c in arms["agreement_cascades"]}
    assert set(cascades) == {"cascade:as-vote", "cascade:half-cost"} and {c["vote"] for c in cascades.values()} == {"vote:top5"}
    asked = store.query(
        "SELECT w.arm, w.workflow_id, any_value(w.n_steps) AS n_steps, any_value(w.cost_usd) AS cost, "
        "sum(c.cost_usd) AS call_cost, count(*) AS calls FROM workflows w JOIN calls c USING (workflow_id) "
        "WHERE w.arm LIKE 'cascade:%' AND w.run_id = $r GROUP BY ALL", {"r": arms["run_id"]},
    )
    assert asked.height == 2 * SLICE and (asked["calls"] == asked["n_steps"]).all() and set(asked["calls"]) <= {2, 3, 5}
    assert (asked["cost"] - asked["call_cost"]).abs().max() < 1e-12
    questions = store.query("SELECT DISTINCT question_id FROM workflows WHERE run_id = $r", {"r": arms["run_id"]})
    assert all(split_of(q) == "eval" for q in questions["question_id"])

    tables = metadata(result, "eval_tables")
    assert tables["n_scored"] == SLICE and tables["n_label"] == f"n={SLICE} of {SLICE} planned"
    assert "conductor:hf:tiny" in tables["arm_table"] and "oracle" in tables["arm_table"]
    assert "solvable_reached_solver" in tables["decomposition"]
    assert tables["running_gap"] == "fewer than 50 common questions"
    assert tables["accuracy_vs_cost_plot"].startswith("![accuracy vs cost per arm](data:image/png;base64,")
    assert "no_workflow" in tables["parse_codes"] or "json_decode" in tables["parse_codes"]
    assert "| w_router " in tables["arm_table"]
    assert "W-router" in tables["routing_value"] and "oracle headroom recovered" in tables["routing_value"]
    assert 0.0 <= tables["w_router_accuracy"] <= 1.0
    assert "w_router" in tables["decomposition"]
    # Every arm but the reference has a verdict line, short enough to show without a click.
    assert len(tables["verdicts"]) < 1000
    for arm in ("solo:deepseek-v2.5", "w_router", "w_cascade@0.5", "vote:all (from recordings)", "conductor:hf:tiny+W"):
        assert f"- {arm}: **" in tables["verdicts"], arm
    assert "**conductor:hf:tiny+W**" in tables["conductor_vs_best_single"]
    # The conductor against what tells routing from format and position, paired.
    for reference in ("best single worker", "random routing", "vote over the best five", "pool-file order"):
        assert reference in tables["conductor_pairs"], reference
    assert "conductor:hf:tiny+W" in tables["order_invariance"] and "same final worker" in tables["order_invariance"]
    assert "position 0" in tables["steps_by_position"] or "no parsed conductor workflow" in tables["steps_by_position"]
    assert "**loses**" in tables["conductor_vs_best_single"] and "Gap in points" in tables["conductor_vs_best_single"]
    assert len(tables["conductor_vs_best_single"]) < 1000
    assert "p (Holm)" in tables["paired_vs_best_single"] and "Holm-adjusted over the table's" in tables["paired_vs_best_single"]
    assert "| best_single (gpt-4o) " in tables["arm_table"] and "est." in tables["arm_table"]
    assert "w_router, cheapest configuration" in tables["cost_story"] and "vote:all" in tables["cost_story"]
    assert "on the frontier" in tables["cost_frontier"]
    assert "escalated_share" in tables["cascades"] and "the vote it stops early" in tables["cascades"]
    assert "gap to best single (train-chosen), pts" in tables["decomposition"]
    # The tables as data beside the run, one parquet file each: what `make seeds` and a notebook read.
    run_id = arms["run_id"]
    written = {path.name.removeprefix(f"{run_id}_").removesuffix(".parquet")
               for path in (artifacts_root() / "eval_tables").glob(f"{run_id}_*.parquet")}
    assert written == {"arms", "running_gap", "paired", "question_scores", "conductor_pairs", "positions",
                       "order_agreement", "cost_sweep"}
    arm_rows = pl.read_parquet(artifacts_root() / "eval_tables" / f"{run_id}_arms.parquet")
    assert sorted(arm_rows["arm"]) == sorted(arms["arms"])

    # The W that routed saw only train-split questions: the probed calibration questions, none of the slice.
    routing_w = load_world_model(arms["world_model_path"])
    probed = set(store.query("SELECT DISTINCT question_id FROM calls WHERE kind = 'probe'")["question_id"])
    assert routing_w.training_question_ids == probed and arms["world_model_training_questions"] == len(probed)
    assert all(split_of(q) == "train" for q in routing_w.training_question_ids)
    assert not routing_w.training_question_ids & set(questions["question_id"])
    assert check.metadata["world_model_questions_on_eval_split"].value == 0

    # The leak check fails once a training rollout is logged on an eval question.
    assert isinstance(summary, EvalRunSummary)
    leaked = summary.slice_ids[0]
    store.insert(
        "calls",
        [CallRecord(call_id="train-1", run_id="grpo-run", kind="conductor", question_id=leaked, worker="conductor",
                    sample=0, subtask=None, response="model_id = []", extracted_answer=None, correct=None,
                    status="ok", error=None, prompt_tokens=1, completion_tokens=1, cost_usd=None, latency_s=0.1,
                    started_at=None)],
    )
    context = dg.build_asset_check_context(instance=dg.DagsterInstance.ephemeral())
    verdict = eval_slice_has_no_leak(
        context, eval_arms=summary, warehouse=WarehouseResource(database=str(warehouse_path))
    )
    assert verdict.passed is False and verdict.metadata["leaked_training"].value == 1

    # So does a routing W that was trained on an eval-split question.
    w_leak = dataclasses.replace(summary, extra={**summary.extra, "world_model_training_question_ids": (leaked,)})
    verdict = eval_slice_has_no_leak(context, eval_arms=w_leak, warehouse=WarehouseResource(database=str(warehouse_path)))
    assert verdict.passed is False and verdict.metadata["world_model_questions_on_eval_split"].value == 1


def test_a_pool_that_seats_the_conductor_gives_a_recursive_arm_and_its_recursion_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = probed_warehouse(monkeypatch, tmp_path, RECURSIVE_POOL)
    tiny = build_tiny_causal_lm(tmp_path / "tiny")
    lean = {"slice_size": 10, "world_model_router": False, "w_cascade": False, "vote_arms": False}

    def run(conductor: ConductorPolicyResource, **config: object) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            EVALUATION_ASSETS,
            resources={
                "warehouse": WarehouseResource(database=str(path)), "pool": PoolResource(pool=RECURSIVE_POOL),
                "conductor": conductor,
            },
            run_config={"ops": {"eval_arms": {"config": {**lean, **config}}}},
        )

    result = run(ConductorPolicyResource(model_path=str(tiny), max_new_tokens=24, n_examples=1))
    assert result.success
    arms = metadata(result, "eval_arms")["arms"]
    assert arms[-2:] == ["conductor:hf:tiny+recursive", "conductor:hf:tiny@shuffled+recursive"]
    assert not any(a.startswith("solo:conductor") for a in arms)
    tables = metadata(result, "eval_tables")
    # Random weights write no workflow, so nothing recursed: the table says so rather than vanishing.
    assert "| conductor:hf:tiny+recursive " in tables["recursion"]
    assert "share_recursed" in tables["recursion"] and "accuracy_not_recursed" in tables["recursion"]

    # The untrained default conductor (no checkpoint) is left out unless asked for.
    lean_run = run(ConductorPolicyResource())
    assert not any(a.startswith("conductor:") for a in metadata(lean_run, "eval_arms")["arms"])
    assert "recursion" not in metadata(lean_run, "eval_tables")


def test_training_questions_include_the_latest_contested_set_and_logged_rollouts(tmp_path: Path) -> None:
    store = Warehouse(tmp_path / "w.duckdb")
    instance = dg.DagsterInstance.ephemeral()
    assert questions_seen_in_training(store, instance) == []
    manifest = tmp_path / "contested.json"
    manifest.write_text('{"question_ids": ["test/algebra/1.json", "test/algebra/2.json"]}')
    instance.report_runless_asset_event(
        dg.AssetMaterialization("contested_set", metadata={"manifest_path": dg.MetadataValue.path(str(manifest))})
    )
    instance.report_runless_asset_event(
        dg.AssetMaterialization("conductor_checkpoint", metadata={"checkpoint_path": dg.MetadataValue.path("/ckpt")})
    )
    assert questions_seen_in_training(store, instance) == ["test/algebra/1.json", "test/algebra/2.json"]
    assert latest_metadata_value(instance, "conductor_checkpoint", "checkpoint_path") == "/ckpt"


def test_eval_arms_shows_its_checkpoint_and_world_model_as_lineage_but_eval_job_does_not_run_them() -> None:
    defs = build_definitions(POOL)
    eval_arms = defs.get_assets_def("eval_arms")
    upstream = {key.to_user_string() for key in eval_arms.asset_deps[eval_arms.key]}
    assert {"pass_rates", "conductor_checkpoint", "world_model"} <= upstream
    # The eval job selects only the evaluation group: a refused (gated) training does not block it,
    # and test_eval_arms_and_tables_on_a_30_question_slice materializes it without either upstream.
    job = defs.resolve_job_def("eval_job")
    assert job.graph.has_node_named("eval_arms") and not job.graph.has_node_named("conductor_checkpoint")
    assert not job.graph.has_node_named("world_model")


def test_the_routing_summary_reads_the_latest_report_and_ceilings_of_its_own_pool() -> None:
    instance = dg.DagsterInstance.ephemeral()
    assert world_model_routing(instance, POOL) is None and probe_ceilings(instance, POOL) is None
    figures = {"questions": 2040, "population": "2040 questions", "w_router": 0.807, "best_single": 0.817,
               "oracle": 0.910, "headroom_recovered": [-0.0995, -0.194, 0.005]}
    instance.report_runless_asset_event(dg.AssetMaterialization("world_model_report", metadata={
        f"routing_figures[{POOL}]": dg.MetadataValue.json(figures),
        f"headroom_recovered[{POOL}]": dg.MetadataValue.float(-0.0995),
    }))
    instance.report_runless_asset_event(dg.AssetMaterialization("oracle_ceilings", metadata={
        "pool": "another-pool", "n_questions": 10, "best_single": 0.5, "oracle": 0.9,
    }))
    assert world_model_routing(instance, POOL) == figures
    assert world_model_routing(instance, "another-pool") is None
    assert probe_ceilings(instance, POOL) is None  # the latest ceilings are another pool's
    assert probe_ceilings(instance, "another-pool") == {"n_questions": 10, "best_single": 0.5, "oracle": 0.9}


def test_a_trained_policy_is_prompted_as_trained_and_new_weights_start_a_new_eval_run(
    warehouse_path: Path, tmp_path: Path
) -> None:
    """The latest conductor_checkpoint is prompted and sampled as its `prompt` metadata says (not
    like the conductor resource), and retraining it in place gives a new eval run id, so the
    rerun evaluates the new weights instead of reusing the old ones' workflows."""
    checkpoint = build_tiny_causal_lm(tmp_path / "checkpoint")
    trained_prompt = {
        "naming": "names", "n_examples": 0, "max_new_tokens": 12, "temperature": 1.0, "show_predicted_success": False,
        "constrained_decoding": True,
    }
    lean = {"slice_size": 4, "world_model_router": False, "w_cascade": False, "vote_arms": False}

    def evaluate(instance: dg.DagsterInstance) -> dict:
        result = dg.materialize(
            [EVALUATION_ASSETS[0]], instance=instance,
            resources={
                "warehouse": WarehouseResource(database=str(warehouse_path)), "pool": PoolResource(pool=POOL),
                "conductor": ConductorPolicyResource(max_new_tokens=24, n_examples=1),  # the untrained default
            },
            run_config={"ops": {"eval_arms": {"config": lean}}},
        )
        assert result.success
        return metadata(result, "eval_arms")

    with dg.DagsterInstance.ephemeral() as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization("conductor_checkpoint", metadata={
            "checkpoint_path": dg.MetadataValue.path(str(checkpoint)), "prompt": dg.MetadataValue.json(trained_prompt),
        }))
        first = evaluate(instance)
        assert first["arms"][-2:] == ["conductor:hf:checkpoint", "conductor:hf:checkpoint@shuffled"]
        # a checkpoint trained before fan_outs_only and ranked catalogues existed is prompted with them off, as trained
        assert first["conductor_prompts"] == {
            "hf:checkpoint": {"model": str(checkpoint), **trained_prompt, "fan_outs_only": False, "ranked_catalogue": False}
        }
        store = Warehouse(warehouse_path)
        conductor_calls = store.query(
            "SELECT c.completion_tokens, c.prompt_tokens FROM calls c JOIN workflows w USING (workflow_id) "
            "WHERE w.run_id = $r AND c.kind = 'conductor'", {"r": first["run_id"]},
        )
        assert conductor_calls.height == 2 * 4 and conductor_calls["completion_tokens"].max() <= 12  # two orders

        assert evaluate(instance)["run_id"] == first["run_id"], "the same weights and prompt resume the same run"
        build_tiny_causal_lm(tmp_path / "checkpoint", seed=1)  # retrained in place: same path, new weights
        second = evaluate(instance)
        assert second["run_id"] != first["run_id"]
        rerun = store.query("SELECT count(*) AS n FROM workflows WHERE run_id = $r AND arm = 'conductor:hf:checkpoint'",
                            {"r": second["run_id"]})
        assert rerun["n"][0] == 4


def _trained_checkpoint(tmp_path: Path) -> dg.AssetsDefinition:
    """A stand-in `conductor_checkpoint` whose materialization names a real (tiny) model on disk."""
    checkpoint = build_tiny_causal_lm(tmp_path / "checkpoint")

    @dg.asset(name="conductor_checkpoint")
    def trained() -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"checkpoint_path": dg.MetadataValue.path(str(checkpoint))})

    return trained


def _evaluated_arms(instance: dg.DagsterInstance, warehouse_path: Path, tags: dict[str, str]) -> list[str]:
    """The arms of a two-question eval run tagged `tags` (no W, votes or shuffled twins)."""
    result = dg.materialize(
        [EVALUATION_ASSETS[0]], instance=instance, tags=tags,
        resources={
            "warehouse": WarehouseResource(database=str(warehouse_path)), "pool": PoolResource(pool=POOL),
            "conductor": ConductorPolicyResource(max_new_tokens=12, n_examples=0),
        },
        run_config={"ops": {"eval_arms": {"config": {
            "slice_size": 2, "world_model_router": False, "w_cascade": False, "vote_arms": False,
            "shuffled_catalogue": False,
        }}}},
    )
    assert result.success
    return metadata(result, "eval_arms")["arms"]


def test_a_seed_run_evaluates_only_the_checkpoint_its_own_seed_trained(warehouse_path: Path, tmp_path: Path) -> None:
    """After a seed whose gate closed, the latest checkpoint is another seed's: evaluating it under
    this seed's tag would count one conductor as two seeds of the recipe."""
    with dg.DagsterInstance.ephemeral() as instance:
        assert dg.materialize([_trained_checkpoint(tmp_path)], instance=instance, tags={"seed": "0"}).success
        assert "conductor:hf:checkpoint" not in _evaluated_arms(instance, warehouse_path, {"seed": "1"})
        assert "conductor:hf:checkpoint" in _evaluated_arms(instance, warehouse_path, {"seed": "0"})


def test_an_eval_only_settings_file_evaluates_the_checkpoint_its_profile_trained(
    warehouse_path: Path, tmp_path: Path
) -> None:
    """A settings file that sets only the eval (a larger slice) names its own recipe, but trains the
    profile's: its eval reads the profile's checkpoint. A file that trains otherwise does not, and a
    run from before the `trained_recipe` tag is read by its recipe."""
    trained = _trained_checkpoint(tmp_path)
    with dg.DagsterInstance.ephemeral() as instance:
        profile = {"seed": "0", "recipe": "cpu", "trained_recipe": "cpu"}
        assert dg.materialize([trained], instance=instance, tags=profile).success
        eval_only = {"seed": "0", "recipe": "cpu+larger-slice", "trained_recipe": "cpu"}
        assert "conductor:hf:checkpoint" in _evaluated_arms(instance, warehouse_path, eval_only)
        other = {"seed": "0", "recipe": "cpu+fan-outs", "trained_recipe": "cpu+fan-outs"}
        assert "conductor:hf:checkpoint" not in _evaluated_arms(instance, warehouse_path, other)
        assert dg.materialize([trained], instance=instance, tags={"seed": "0", "recipe": "cpu+fan-outs"}).success
        assert "conductor:hf:checkpoint" in _evaluated_arms(instance, warehouse_path, other)
