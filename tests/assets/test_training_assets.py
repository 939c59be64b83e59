"""The training chain's gates really block, the contested set never leaks eval questions, and
training resumes from its last checkpoint.

Real components throughout: a DuckDB warehouse in tmp_path with probe rows written directly
(the pass rates a probe of the replay pool would produce), the replay-mixed6 pool's recorded
GSM8K answers for rollouts, the tiny offline policy and TRL's GRPOTrainer at toy sizes.
"""

from __future__ import annotations

from dataclasses import replace

import asyncio
import json
from pathlib import Path

import dagster as dg
import pytest

from assets.training import (
    TRAINING_ASSETS,
    TRAINING_CHECKS,
    TRAINING_JOBS,
    conductor_checkpoint,
    contested_dir,
    contested_set,
    contested_set_size,
    grpo_probe_run,
    pass_rates,
)
from assets.world_model import world_model_path
from conductor_pipeline.corpora.loaders import load_gsm8k
from conductor_pipeline.splits import split_of
from conductor_pipeline.training.dataset import TrainingDataError, bonus_predictor, read_contested_manifest
from conductor_pipeline.training.gates import evaluate_zero_variance, read_verdict, write_verdict
from conductor_pipeline.training.reward import ROLLOUT_POSITION, TRAINING_STEP, make_conductor_reward
from conductor_pipeline.training.rollouts import PoolExecutor, frozen_conductor
from conductor_pipeline.training.telemetry import RolloutLog, RowBuffer
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.warehouse import Warehouse
from resources.pool import PoolResource
from resources.trainer import TrainerResource
from resources.warehouse import WarehouseResource
from tests.shared_data import require_shared_data

POOL = "replay-mixed6"
WEAK = "llama-3.1-8b"
WORKERS = ["gpt-4o", "claude-3.5-sonnet", "gemini-1.5-pro", "llama-3.1-405b", "deepseek-v2.5", WEAK]
SAMPLES = 5  # k samples: 0/5 vs 5/5 Wilson 95% intervals separate (0/3 vs 3/3 do not)
N_TRAIN, N_EVAL = 6, 3
# Toy GRPO: 2 questions x 4 rollouts per step, short completions.
TOY = dict(num_generations=4, questions_per_step=2, max_completion_length=24, probe_steps=2, save_steps=10)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_causal_lm(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture
def gsm8k(monkeypatch, tmp_path):
    require_shared_data(monkeypatch, tmp_path / "cache", "gsm8k_test", "zeroeval_outputs")
    questions = load_gsm8k("test")
    train = [q for q in questions if split_of(q.question_id) == "train"][:N_TRAIN]
    held_out = [q for q in questions if split_of(q.question_id) == "eval"][:N_EVAL]
    return train, held_out


def _warehouse(tmp_path: Path, questions, *, weak_correct: bool, pool: str = POOL) -> str:
    """Questions plus k probe samples per worker: every worker right, except (optionally) the weak one."""
    database = tmp_path / "warehouse.duckdb"
    store = Warehouse(database)
    store.insert("questions", questions)
    rows = [
        {
            "call_id": f"{q.question_id}|{w}|{s}", "run_id": "fixture", "kind": "probe", "question_id": q.question_id,
            "worker": w, "sample": s, "correct": weak_correct or w != WEAK, "status": "ok", "pool": pool,
        }
        for q in questions
        for w in WORKERS
        for s in range(SAMPLES)
    ]
    store.insert("calls", rows)
    return str(database)


def _resources(database: str, tmp_path: Path, tiny_model: Path, pool: str = POOL, **trainer) -> dict:
    return {
        "warehouse": WarehouseResource(database=database),
        "pool": PoolResource(pool=pool),
        "trainer": TrainerResource(output_root=str(tmp_path / "training"), policy_model=str(tiny_model), **{**TOY, **trainer}),
    }


def _contested_manifest(resources: dict) -> dict:
    return read_contested_manifest(contested_dir(resources["warehouse"]), POOL)


def _chain(resources: dict, min_size: int, selection=TRAINING_ASSETS) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [*TRAINING_ASSETS, *TRAINING_CHECKS, pass_rates],
        selection=dg.AssetSelection.assets(*selection),
        resources=resources,
        run_config=dg.RunConfig(ops={"contested_set": {"config": {"min_size": min_size}}}),
        raise_on_error=False,
    )


def _materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in (ev.asset_check_evaluation_data for ev in result.all_events
                                             if ev.event_type_value == "ASSET_CHECK_EVALUATION")}


def test_contested_set_keeps_only_train_questions_the_pool_splits_on(gsm8k, tmp_path, tiny_model):
    train, held_out = gsm8k
    database = _warehouse(tmp_path, [*train, *held_out], weak_correct=False)
    resources = _resources(database, tmp_path, tiny_model)
    result = dg.materialize(
        [contested_set, contested_set_size, pass_rates], selection=dg.AssetSelection.assets(contested_set),
        resources=resources, run_config=dg.RunConfig(ops={"contested_set": {"config": {"min_size": 100}}}),
        raise_on_error=False,
    )
    manifest = _contested_manifest(resources)
    # Every question splits the pool (weak 0/3, the rest 3/3), but only the train side may enter.
    assert sorted(manifest["question_ids"]) == sorted(q.question_id for q in train)
    assert not {q.question_id for q in held_out} & set(manifest["question_ids"])
    assert manifest["weak"] == WEAK and manifest["counts"]["separated"] == N_TRAIN
    # k = 5 samples per cell: the one-sample view is reported (here it agrees with k samples).
    assert manifest["one_sample_flips"]["flipped"] == 0
    [event] = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert metadata["size"].value == N_TRAIN and metadata["split"].value == "train only"
    assert {"rule", "counts_per_class", "one_sample_flips", "pool_mean_pass_rate_histogram", "split_fingerprint"} <= set(metadata)
    assert _checks(result) == {"contested_set_size": False}  # 6 < 100: blocking failure


def test_contested_set_keeps_only_the_corpora_it_is_given(gsm8k, tmp_path, tiny_model):
    train, _ = gsm8k
    as_math = [
        replace(q, question_id=f"test/algebra/{i}.json", corpus="math", level=5)
        for i, q in enumerate(train * 4)
    ]
    as_math = [q for q in as_math if split_of(q.question_id) == "train"]
    database = _warehouse(tmp_path, [*train, *as_math], weak_correct=False)
    resources = _resources(database, tmp_path, tiny_model)

    def materialize(corpora):
        config = {"min_size": 1, "corpora": corpora}
        return dg.materialize(
            [contested_set, contested_set_size, pass_rates], selection=dg.AssetSelection.assets(contested_set),
            resources=resources, run_config=dg.RunConfig(ops={"contested_set": {"config": config}}), raise_on_error=False,
        )

    assert materialize(["math"]).success
    manifest = _contested_manifest(resources)
    assert sorted(manifest["question_ids"]) == sorted(q.question_id for q in as_math)
    assert manifest["rule"]["corpora"] == ["math"]

    assert materialize(None).success
    assert len(_contested_manifest(resources)["question_ids"]) == len(train) + len(as_math)

    refused = materialize(["aime"])
    assert not refused.success
    [failure] = [e for e in refused.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.cause.message if failure.step_failure_data.error.cause else ""
    message += failure.step_failure_data.error.message
    assert "aime" in message and "gsm8k" in message and "math" in message


def test_a_pool_where_every_question_is_easy_never_reaches_training(gsm8k, tmp_path, tiny_model):
    train, _ = gsm8k
    database = _warehouse(tmp_path, train, weak_correct=True)
    result = _chain(_resources(database, tmp_path, tiny_model, sft_warm_start=False), min_size=1)
    assert not result.success
    assert _checks(result) == {"contested_set_size": False}
    assert _materialized(result) == {"contested_set"}  # no probe, no gate, no checkpoint
    assert _contested_manifest(_resources(database, tmp_path, tiny_model))["counts"]["all_solve"] == N_TRAIN


def test_failed_zero_variance_gate_stops_training_now_and_in_later_runs(gsm8k, tmp_path, tiny_model):
    """An untrained policy never writes a parseable workflow: every group scores 0, the gate fails."""
    train, _ = gsm8k
    database = _warehouse(tmp_path, train, weak_correct=False)
    resources = _resources(database, tmp_path, tiny_model, sft_warm_start=False, reward_variant="strict")
    result = _chain(resources, min_size=1)

    assert not result.success
    assert _checks(result) == {"contested_set_size": True, "zero_variance_gate": False}
    assert _materialized(result) == {"contested_set", "warm_start_policy", "grpo_probe_run"}
    trainer: TrainerResource = resources["trainer"]
    verdict = read_verdict(trainer.gate_path(POOL))
    assert verdict is not None and not verdict.passed and verdict.figure == 1.0 and verdict.group_size == 4
    steps = Warehouse(database).query("SELECT phase, group_size, parse_fail_rate FROM training_steps ORDER BY step")
    assert steps["phase"].to_list() == ["probe", "probe"] and steps["group_size"].to_list() == [4, 4]
    assert steps["parse_fail_rate"].to_list() == [1.0, 1.0]
    [probe] = result.asset_materializations_for_node("grpo_probe_run")
    assert "1.000 of 4 groups (group size 4" in probe.metadata["summary"].value
    # Every rollout is telemetry: the probe's 2 steps x 2 questions x 4 rollouts, and the warm
    # start's parse check (6 prompts x 8 samples), each a `workflows` row with its conductor call.
    store = Warehouse(database)
    phases = store.query("SELECT phase, training_step, count(*) AS n FROM workflows GROUP BY ALL ORDER BY ALL")
    assert phases.rows() == [("parse_check_before", None, 48), ("probe", 1, 8), ("probe", 2, 8)]
    conductor_calls = store.query("SELECT count(*) AS n FROM calls WHERE kind = 'conductor'")["n"][0]
    assert conductor_calls == 64
    assert probe.metadata["rollout_telemetry"].value["matches_training_steps"] is True
    assert probe.metadata["same_correctness_fraction"].value == 1.0 and probe.metadata["gate_on"].value == "reward"
    assert "Parse failures over all 16 rollouts: 1.000" in probe.metadata["summary"].value
    [warm] = result.asset_materializations_for_node("warm_start_policy")
    assert warm.metadata["rollout_telemetry"].value["workflows"] == 48
    # One device setting, resolved once (auto: cuda when torch sees a GPU), reaches every step.
    assert warm.metadata["device"].value == probe.metadata["device"].value == trainer.resolved_device

    later = dg.materialize(
        [conductor_checkpoint, *TRAINING_ASSETS[:-1], pass_rates],
        selection=dg.AssetSelection.assets(conductor_checkpoint), resources=resources, raise_on_error=False,
    )
    assert not later.success and not _materialized(later)
    [failure] = [e for e in later.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "training refused" in failure.step_failure_data.error.message
    assert not trainer.checkpoint_dir(POOL).exists()


def test_a_probe_of_the_same_inputs_is_reused_and_other_inputs_probe_again(gsm8k, tmp_path, tiny_model):
    train, _ = gsm8k
    database = _warehouse(tmp_path, train, weak_correct=False)

    def probe(**trainer) -> dict:
        resources = _resources(database, tmp_path, tiny_model, sft_warm_start=False, **trainer)
        result = _chain(resources, min_size=1, selection=[contested_set, grpo_probe_run])
        [event] = result.asset_materializations_for_node("grpo_probe_run")
        return {key: value.value for key, value in event.metadata.items()}

    first = probe()
    assert first["probe_run_id"].startswith(f"probe-{POOL}-") and first["steps"] == TOY["probe_steps"]
    again = probe()
    assert again["probe_run_id"] == first["probe_run_id"] and again["steps"] == first["steps"]
    assert again["zero_variance_fraction"] == first["zero_variance_fraction"]
    logged = Warehouse(database).query("SELECT run_id, count(*) AS n FROM training_steps GROUP BY 1")
    assert logged.rows() == [(first["probe_run_id"], TOY["probe_steps"])]  # nothing sampled twice
    other = probe(naming="names")  # the default recipe's naming is ordinal
    assert other["probe_run_id"] != first["probe_run_id"]
    assert Warehouse(database).query("SELECT count(DISTINCT run_id) AS n FROM training_steps")["n"][0] == 2


def _open_gate(trainer: TrainerResource, probe_run_id: str = "probe-fixture", pool: str = POOL) -> None:
    """A probe that passed: its manifest and a passed verdict, as the probe asset and gate write them."""
    probe_dir = trainer.probe_dir(pool)
    probe_dir.mkdir(parents=True, exist_ok=True)
    (probe_dir / "latest_probe.json").write_text(json.dumps({"probe_run_id": probe_run_id, "steps": []}))
    rows = [{"frac_zero_std": 0.0}] * 2
    write_verdict(trainer.gate_path(pool), evaluate_zero_variance(rows, probe_run_id=probe_run_id, group_size=4, groups_per_step=2))


def test_training_checkpoints_and_a_rerun_resumes_from_the_last_checkpoint(gsm8k, tmp_path, tiny_model):
    train, _ = gsm8k
    database = _warehouse(tmp_path, train, weak_correct=False)
    steps = 2

    def train_to(max_steps: int) -> dg.ExecuteInProcessResult:
        # The gate is not under test here (four toy groups of an untrained policy): it opens for any flat share.
        resources = _resources(database, tmp_path, tiny_model, sft_warm_start=False, max_steps=max_steps,
                               zero_variance_threshold=1.0)
        if max_steps == steps:
            _chain(resources, min_size=1, selection=[contested_set])
            _open_gate(resources["trainer"])
        result = dg.materialize(
            [conductor_checkpoint, *TRAINING_ASSETS[:-1], pass_rates],
            selection=dg.AssetSelection.assets(conductor_checkpoint), resources=resources,
        )
        return result.asset_materializations_for_node("conductor_checkpoint")[0].metadata

    first = train_to(steps)  # a run stopped (killed) at step N left checkpoint-N
    assert first["step"].value == steps and first["resumed_from"].value == "none"
    assert Path(first["checkpoint_path"].value).name == f"checkpoint-{steps}"
    second = train_to(2 * steps)
    assert Path(second["resumed_from"].value).name == f"checkpoint-{steps}"
    assert second["step"].value == 2 * steps and Path(second["checkpoint_path"].value).name == f"checkpoint-{2 * steps}"
    logged = Warehouse(database).query("SELECT step, phase FROM training_steps ORDER BY step")
    assert logged["step"].to_list() == [1, 2, 3, 4] and set(logged["phase"]) == {"grpo"}
    # The resumed run added steps 3-4's rollouts, nothing twice, and they agree with training_steps.
    rollouts = Warehouse(database).query(
        "SELECT training_step, count(*) AS n FROM workflows WHERE phase = 'grpo' GROUP BY 1 ORDER BY 1"
    )
    assert rollouts.rows() == [(1, 8), (2, 8), (3, 8), (4, 8)]
    run_id = second["rollout_telemetry"].value["run_id"]
    assert run_id == first["training_run_id"].value and run_id.startswith(f"grpo-{POOL}-")  # the same recipe, longer
    assert second["rollout_telemetry"].value == {
        "run_id": run_id, "workflows": 32, "conductor_calls": 32,
        "step_calls": second["rollout_telemetry"].value["step_calls"], "matches_training_steps": True,
    }
    # A changed input (here the learning rate) is another run: it starts at step 1 in its own
    # folder, and the first run's checkpoints stay where they are.
    third = dg.materialize(
        [conductor_checkpoint, *TRAINING_ASSETS[:-1], pass_rates], selection=dg.AssetSelection.assets(conductor_checkpoint),
        resources=_resources(database, tmp_path, tiny_model, sft_warm_start=False, max_steps=steps, learning_rate=3e-4),
    ).asset_materializations_for_node("conductor_checkpoint")[0].metadata
    assert third["training_run_id"].value != run_id and third["resumed_from"].value == "none"
    assert Path(third["checkpoint_path"].value).parent.name == third["training_run_id"].value
    assert (Path(second["checkpoint_path"].value).parent / f"checkpoint-{2 * steps}").is_dir()
    assert {"learning", "halves"} <= set(second)
    assert {"curves", "curves_path", "gate", "group_size", "checkpoint", "global_step"} <= set(second)
    assert second["global_step"].value == 2 * steps and "resumed from checkpoint-2" in second["checkpoint"].value
    # How the policy was prompted and sampled in training: evaluation prompts the checkpoint the same way.
    trainer = _resources(database, tmp_path, tiny_model, sft_warm_start=False)["trainer"]
    recipe = trainer.recipe()
    assert second["prompt"].value == {
        "naming": "ordinal", "n_examples": recipe.prompt.n_examples, "temperature": 1.0,
        "max_new_tokens": recipe.grpo.max_completion_length, "show_predicted_success": True, "ranked_catalogue": True,
        "constrained_decoding": True, "fan_outs_only": False,
    }


def test_gpu_profile_builds_the_paper_configuration(tmp_path):
    trainer = TrainerResource(
        profile="gpu", policy_model="Qwen/Qwen2.5-1.5B-Instruct", vllm_mode="server",
        vllm_server_base_url="http://127.0.0.1:8000", output_root=str(tmp_path),
    )
    settings = trainer.recipe().grpo
    assert (settings.policy_model, settings.num_generations, settings.questions_per_step) == ("Qwen/Qwen2.5-1.5B-Instruct", 64, 4)
    assert (settings.learning_rate, settings.beta, settings.temperature, settings.max_steps) == (1e-6, 0.0, 1.0, 200)
    assert trainer.base_policy_path() == "Qwen/Qwen2.5-1.5B-Instruct" and trainer.recipe().prompt.n_examples == 4
    config = settings.to_grpo_config(tmp_path / "grpo", bf16=False, use_cpu=True)  # build only: no GPU here
    assert config.use_vllm and config.vllm_mode == "server" and config.num_generations == 64
    assert config.save_steps == 10 and config.learning_rate == 1e-6
    probe = trainer.recipe().probe()
    assert probe.max_steps == 20 and TrainerResource().recipe().grpo.policy_model == "tiny"
    assert {job.name for job in TRAINING_JOBS} == {"training_job", "probe_gate_job"}


def test_world_model_pruning_drops_predicted_flat_questions_and_audits_the_skip(gsm8k, tmp_path, tiny_model):
    """W learns from the pool's evaluation steps (which the world_model asset reads, and the pass rates
    do not) that everyone solves half the questions; the trainer option drops those from the probe's
    GRPO set and samples them anyway to audit the skip."""
    from assets.world_model import world_model

    train, _ = gsm8k
    database = _warehouse(tmp_path, train, weak_correct=False)  # every question contested in POOL
    believed_easy = train[: N_TRAIN // 2]
    Warehouse(database).insert("calls", [
        {"call_id": f"eval|{q.question_id}|{w}|{s}", "run_id": "fixture", "kind": "step", "question_id": q.question_id,
         "worker": w, "sample": s, "correct": True, "status": "ok", "pool": POOL, "visible_steps": 0}
        for q in believed_easy for w in WORKERS for s in range(40)
    ])
    resources = _resources(database, tmp_path, tiny_model, sft_warm_start=False, reward_variant="strict",
                           prune_with_world_model=True, prune_high=0.8, prune_audit_questions=2)
    without_model = _chain(resources, min_size=1, selection=[contested_set, TRAINING_ASSETS[1], TRAINING_ASSETS[2]])
    [failure] = [e for e in without_model.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "materialize world_model first" in failure.step_failure_data.error.message

    dg.materialize([world_model, pass_rates], selection=dg.AssetSelection.assets(world_model), resources=resources)
    result = _chain(resources, min_size=1, selection=[contested_set, TRAINING_ASSETS[1], TRAINING_ASSETS[2]])
    assert "contested_set" in _materialized(result)
    assert _contested_manifest(resources)["size"] == N_TRAIN  # the contested set itself is untouched
    [probe] = result.asset_materializations_for_node("grpo_probe_run")
    pruning = probe.metadata["world_model_pruning"].value
    assert probe.metadata["pruned_questions"].value == len(believed_easy)
    assert (pruning["contested"], pruning["kept"], pruning["skipped"]) == (N_TRAIN, N_TRAIN - len(believed_easy), len(believed_easy))
    audit = pruning["skipped_audit"]
    assert audit["sampled"] == 2 and audit["observed"] == 2 and 0 <= audit["really_zero_variance"] <= 2
    assert pruning["kept_observed"]["observed"] <= N_TRAIN - len(believed_easy)  # the probe rolled out kept ones only
    manifest = json.loads((resources["trainer"].probe_dir(POOL) / "latest_probe.json").read_text())
    assert manifest["trained_questions"] == N_TRAIN - len(believed_easy)
    assert manifest["world_model_pruning"]["skipped_audit"] == audit


def test_reward_bonus_sees_ws_prediction_for_the_final_worker_once_per_question(gsm8k, tmp_path):
    train, _ = gsm8k
    pool_config = PoolResource(pool=POOL).load()
    predicted_for: list[str] = []

    def predict(question):
        predicted_for.append(question.question_id)
        return {"gpt-4o": 0.25, WEAK: 0.75}

    executor = PoolExecutor(pool_config, PoolResource(pool=POOL).build_workers(), train, "ordinal", predict)
    row = {"question_id": train[0].question_id, "workers": ["gpt-4o", WEAK]}
    # "Model 1" is the second shown worker: the weak one answers last.
    workflow = "model_id = [0, 1]\nsubtasks = ['solve', 'check']\naccess_list = [[], [0]]"
    to_strong = asyncio.run(executor("model_id = [0]\nsubtasks = ['solve']\naccess_list = [[]]", row))
    to_weak = asyncio.run(executor(workflow, row))
    assert to_strong.expected_success == 0.25 and to_weak.expected_success == 0.75
    assert predicted_for == [train[0].question_id]  # cached: W runs once per question, not per rollout
    assert asyncio.run(executor("not a workflow", row)).expected_success is None

    off = PoolExecutor(pool_config, PoolResource(pool=POOL).build_workers(), train, "ordinal")
    assert asyncio.run(off("model_id = [0]\nsubtasks = ['solve']\naccess_list = [[]]", row)).expected_success is None


def test_reward_bonus_without_a_world_model_fails_naming_the_knob(tmp_path, tiny_model):
    resources = _resources(str(tmp_path / "w.duckdb"), tmp_path, tiny_model, world_model_bonus_weight=0.1)
    weight = resources["trainer"].recipe().grpo.world_model_bonus_weight
    assert weight == 0.1  # reaches the reward's settings
    path, seats = world_model_path(resources["warehouse"], POOL), resources["pool"].load().workers
    off = _resources(str(tmp_path / "w.duckdb"), tmp_path, tiny_model)["trainer"].recipe().grpo.world_model_bonus_weight
    assert bonus_predictor(off, path, seats) is None  # off: W is never loaded
    with pytest.raises(TrainingDataError, match="world_model_bonus_weight is on but no world model"):
        bonus_predictor(weight, path, seats)


def test_cost_weight_scores_a_costlier_route_lower_through_the_executor(gsm8k):
    """The executor sets each rollout's cost from the replayed calls (list prices x estimated tokens),
    so at cost_weight > 0 a route that also pays gpt-4o scores below one that does not, with the same
    final worker (same recorded answer); at cost_weight 0 they score the same."""
    train, _ = gsm8k
    executor = PoolExecutor(PoolResource(pool=POOL).load(), PoolResource(pool=POOL).build_workers(), train, "ordinal")
    row = {"question_id": train[0].question_id, "workers": ["gpt-4o", "deepseek-v2.5"]}
    cheap = "model_id = [1]\nsubtasks = ['solve']\naccess_list = [[]]"
    costly = "model_id = [0, 1]\nsubtasks = ['solve', 'solve']\naccess_list = [[], []]"

    def rewards(cost_weight: float) -> list[float | None]:
        settings = TrainerResource(cost_weight=cost_weight).recipe().grpo
        reward = make_conductor_reward(executor, settings.reward_variant, cost_weight=settings.cost_weight)
        return asyncio.run(reward([row["question_id"]] * 2, [cheap, costly], question_id=[row["question_id"]] * 2,
                                  workers=[row["workers"]] * 2))

    verdicts = [asyncio.run(executor(text, row)) for text in (cheap, costly)]
    assert verdicts[0].correct == verdicts[1].correct is not None  # the same recorded final answer
    assert 0 < verdicts[0].cost_usd < verdicts[1].cost_usd
    free, priced = rewards(0.0), rewards(100.0)
    assert free[0] == free[1]
    assert priced[0] > priced[1]
    assert priced[0] - priced[1] == pytest.approx(100.0 * (verdicts[1].cost_usd - verdicts[0].cost_usd))


RECURSIVE_POOL = "replay-mixed6-recursive"


def test_a_conductor_step_in_a_rollout_is_answered_by_the_frozen_start_policy(gsm8k, tmp_path, tiny_model):
    """A rollout that hands a step to the conductor seat runs one level down on the frozen policy
    (the tiny model, on the CPU): a second conductor call, a scored outcome, no error."""
    train, _ = gsm8k
    pool_config = PoolResource(pool=RECURSIVE_POOL).load()
    [conductor_seat] = [s.name for s in pool_config.workers if s.is_conductor]
    store = Warehouse(tmp_path / "w.duckdb")
    executor = _rollout_executor_for(pool_config, train, RolloutLog(RowBuffer(store), "grpo-rec", "grpo", "policy:test"),
                                     conductor_policy=frozen_conductor(pool_config, tiny_model, "cpu"))
    row = {"question_id": train[0].question_id, "workers": ["gpt-4o", conductor_seat], ROLLOUT_POSITION: 0, TRAINING_STEP: 1}
    verdict = asyncio.run(executor("model_id = [0, 1]\nsubtasks = ['solve', 'improve']\naccess_list = [[], [0]]", row))
    asyncio.run(executor.flush())
    executor.write_rows()
    assert verdict.parse_code == "ok" and verdict.correct is not None
    # The policy's own workflow, then the frozen policy's one level down (filed under the seat's name).
    conductors = store.query("SELECT worker FROM calls WHERE kind = 'conductor' ORDER BY worker")["worker"].to_list()
    assert sorted(conductors) == sorted(["policy:test", conductor_seat])
    assert frozen_conductor(PoolResource(pool=POOL).load(), tiny_model, "cpu") is None  # no seat, no second copy


def _rollout_executor_for(pool_config, questions, log, **kwargs) -> PoolExecutor:
    workers = PoolResource(pool=pool_config.name).build_workers([s.name for s in pool_config.workers if not s.is_conductor])
    return PoolExecutor(pool_config, workers, questions, "ordinal", log=log, **kwargs)


@pytest.mark.parametrize("pool", [RECURSIVE_POOL, "replay-mixed6-vote"])
def test_two_grpo_steps_on_a_pool_with_a_seat_that_cannot_answer_alone(gsm8k, tmp_path, tiny_model, pool):
    """The recursive and the vote pool train like any other: random sub-pools show the conductor or
    vote seat in some prompts (never alone), and two GRPO steps on the tiny policy record every
    rollout; on the vote pool the run's metadata carries the fan-out share per step."""
    train, _ = gsm8k
    database = _warehouse(tmp_path, train, weak_correct=False, pool=pool)
    resources = _resources(database, tmp_path, tiny_model, pool=pool, sft_warm_start=False, max_steps=2)
    _chain(resources, min_size=1, selection=[contested_set])
    _open_gate(resources["trainer"], pool=pool)
    result = dg.materialize(
        [conductor_checkpoint, *TRAINING_ASSETS[:-1], pass_rates],
        selection=dg.AssetSelection.assets(conductor_checkpoint), resources=resources,
    )
    metadata = result.asset_materializations_for_node("conductor_checkpoint")[0].metadata
    assert metadata["step"].value == 2 and metadata["device"].value == resources["trainer"].resolved_device
    assert metadata["rollout_telemetry"].value["matches_training_steps"]
    assert Warehouse(database).query(
        "SELECT training_step, count(*) AS n FROM workflows WHERE phase = 'grpo' GROUP BY 1 ORDER BY 1"
    ).rows() == [(1, 8), (2, 8)]
    if pool == RECURSIVE_POOL:
        assert "fan_out_share" not in metadata
    else:  # the untrained tiny policy writes no workflow, so none fans out; the figure is there all the same
        share = metadata["fan_out_share"].value
        assert share["overall"] == 0.0 and {str(step) for step in share["per_step"]} == {"1", "2"}
        assert "fan out and aggregate" in metadata["learning"].value
