"""A pool that seats the conductor itself, driven through the assets a user runs: `probe_calls`
(the conductor seat is not a probe partition), the contested set and a GRPO probe, two GRPO steps,
and an evaluation whose conductor gives steps to itself. The evaluated conductor is an
OpenAI-compatible endpoint (the project's fault server on 127.0.0.1) that writes the same
workflow for every prompt, its own recursive ones included, so recursion runs to the depth cap."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from assets.definitions import build_definitions
from assets.metadata import latest_metadata
from assets.probing import PROBE_CALLS, all_probe_partitions_tags
from conductor_pipeline.corpora.loaders import load_gsm8k
from tests.fakes.fault_server import FaultServer
from conductor_pipeline.pools.config import load_pool
from conductor_pipeline.training.gates import evaluate_zero_variance, write_verdict
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.warehouse import Warehouse
from resources.conductor import ConductorPolicyResource
from resources.pool import PoolResource
from resources.trainer import TrainerResource
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

POOL = "replay-mixed6-recursive"
# Step 1 asks the first worker; step 2 hands its answer to Model 6, the conductor seat.
WORKFLOW = 'model_id = [0, 6]\nsubtasks = ["Solve the problem.", "Check this answer."]\naccess_list = [[], "all"]'
MAX_DEPTH = 2
SLICE = 4
# The unranked, unconstrained prompt this chain was written for: constrained decoding cannot finish
# the lists within the toy 24-token cap, and recursion does not yet rank its catalogue by W.
TOY_TRAINER = dict(num_generations=4, questions_per_step=2, max_completion_length=24, probe_steps=1, max_steps=2,
                   save_steps=10, sft_warm_start=False, show_predicted_success=False, ranked_catalogue=False,
                   constrained_decoding=False)
RUN_CONFIG = {
    "probe_calls": {"corpora": ["gsm8k"], "samples": 1},
    "contested_set": {"min_size": 1},
    "eval_arms": {
        "corpus": "gsm8k", "slice_size": SLICE, "max_depth": MAX_DEPTH, "world_model_router": False,
        "w_cascade": False, "vote_arms": False,
    },
}


def run(defs: dg.Definitions, job: str, instance: dg.DagsterInstance, **options) -> dg.ExecuteInProcessResult:
    job_def = defs.resolve_job_def(job)
    ops = {op: {"config": config} for op, config in RUN_CONFIG.items() if job_def.graph.has_node_named(op)}
    return job_def.execute_in_process(instance=instance, run_config={"ops": ops}, raise_on_error=False, **options)


def test_a_pool_that_seats_the_conductor_runs_probe_training_and_a_recursive_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_shared_data(monkeypatch, tmp_path / "cache", "gsm8k_test", "zeroeval_outputs")
    database = tmp_path / "warehouse.duckdb"
    store = Warehouse(database)
    store.insert("questions", load_gsm8k("test")[:80])
    tiny = build_tiny_causal_lm(tmp_path / "tiny")
    trainer = TrainerResource(
        output_root=str(tmp_path / "training"), policy_model=str(tiny), device="cpu", **TOY_TRAINER
    )
    project = build_definitions(POOL)
    with FaultServer(answer=WORKFLOW) as conductor_server, dg.DagsterInstance.ephemeral() as instance:
        defs = dg.Definitions(
            assets=project.assets,
            asset_checks=project.asset_checks,
            jobs=[
                *project.jobs,
                dg.define_asset_job("gate", selection=["pass_rates", "contested_set", "grpo_probe_run"]),
                dg.define_asset_job("grpo", selection=["conductor_checkpoint"]),
            ],
            resources={
                "warehouse": WarehouseResource(database=str(database)),
                "pool": PoolResource(pool=POOL),
                "trainer": trainer,
                "conductor": ConductorPolicyResource(
                    kind="openai_endpoint", base_url=conductor_server.base_url, model="fault-server", label="scripted",
                    max_new_tokens=256,
                ),
            },
        )

        # Probing: one partition per seat that answers alone; the conductor seat is none of them.
        partitions = defs.get_assets_def(PROBE_CALLS).partitions_def
        solo = load_pool(POOL).solo_worker_names
        assert partitions.get_partition_keys() == solo and "conductor" not in solo
        assert run(defs, "probe_job", instance, tags=all_probe_partitions_tags(partitions)).success
        probed = store.query("SELECT DISTINCT worker FROM calls WHERE kind = 'probe' ORDER BY worker")["worker"]
        assert probed.to_list() == sorted(solo)

        # The gate's probe run, then two GRPO steps on the pool (the gate is opened by hand: the
        # untrained tiny policy writes no workflow, so its own probe rightly closes it).
        run(defs, "gate", instance)
        probe_run_id = latest_metadata(instance, "grpo_probe_run")["probe_run_id"].value
        write_verdict(trainer.gate_path(POOL), evaluate_zero_variance(
            [{"frac_zero_std": 0.0}], probe_run_id=probe_run_id, group_size=4, groups_per_step=2,
        ))
        assert run(defs, "grpo", instance).success
        assert latest_metadata(instance, "conductor_checkpoint")["step"].value == 2
        assert store.query(
            "SELECT training_step, count(*) AS n FROM workflows WHERE phase = 'grpo' AND parent_workflow_id IS NULL "
            "GROUP BY 1 ORDER BY 1"
        ).rows() == [(1, 8), (2, 8)]

        # Evaluation: every conductor arm recurses on this pool; the scripted one always does.
        assert run(defs, "eval_job", instance).success
        arms = latest_metadata(instance, "eval_arms")["arms"].value
        assert "conductor:scripted+recursive" in arms and "conductor:hf:checkpoint-2+recursive" in arms
        assert not any(arm == "solo:conductor" for arm in arms)
        run_id = latest_metadata(instance, "eval_tables")["run_id"].value
        nested = store.query(
            "SELECT depth, count(*) AS n, count(DISTINCT root_workflow_id) AS roots FROM workflows "
            "WHERE run_id = $run_id AND arm = 'conductor:scripted+recursive' AND parent_workflow_id IS NOT NULL "
            "GROUP BY depth ORDER BY depth",
            {"run_id": run_id},
        ).rows()
        # Each top-level workflow recursed once per level until the cap passed the answer through.
        assert nested == [(depth, SLICE, SLICE) for depth in range(1, MAX_DEPTH + 1)]
        # The nested workflows' steps are calls of their own workflow, linked back to the top level.
        assert store.query(
            "SELECT count(*) AS n FROM calls AS c JOIN workflows AS w USING (workflow_id) "
            "WHERE w.run_id = $run_id AND w.depth > 0 AND c.kind = 'step'",
            {"run_id": run_id},
        ).rows() == [(2 * MAX_DEPTH * SLICE,)]
        recursion = latest_metadata(instance, "eval_tables")["recursion"].value
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in recursion.splitlines()]
    table = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    scripted = table["conductor:scripted+recursive"]
    assert scripted["workflows"] == str(SLICE) and scripted["inner_workflows"] == str(MAX_DEPTH * SLICE)
    assert scripted["share_recursed"] == "1.000" and scripted["max_depth"] == str(MAX_DEPTH)
    assert scripted["steps_top_level"] == "2.000" and scripted["steps_with_inner"] == f"{2 + 2 * MAX_DEPTH:.3f}"
    # The trained tiny policy writes no workflow: its row says nothing recursed rather than vanishing.
    assert table["conductor:hf:checkpoint-2+recursive"]["share_recursed"] == "0.000"
