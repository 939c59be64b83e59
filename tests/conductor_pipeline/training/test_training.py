"""Training glue: settings -> real TRL configs, the reward, SFT warm start, GRPO with resume.

CPU-sized on purpose: the tiny offline model, short prompts, groups of 4, a handful of steps.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from conductor_pipeline.conductor.hf_policy import HFLocalPolicy
from conductor_pipeline.training.grpo import train_grpo
from conductor_pipeline.training.reward import (
    REWARD_FUNC_NAME,
    RolloutVerdict,
    frac_groups_without_signal,
    make_conductor_reward,
    reward_for,
    routing_bonus,
)
from conductor_pipeline.training.rollouts import conductor_prompt_rows
from conductor_pipeline.training.settings import (
    GPU_LORA_ALPHA,
    GPU_LORA_RANK,
    GRPOSettings,
    LoraSettings,
    SFTSettings,
    parameter_billions,
    settings_help,
)
from conductor_pipeline.training.sft import warm_start_sft
from conductor_pipeline.training.tiny_models import build_tiny_causal_lm
from conductor_pipeline.workflow import Step, Workflow, parse_code, parse_workflow, render_workflow

WORKERS = ["qwen-small", "llama-mid", "mistral-big"]
QUESTIONS = [
    f"Tom has {a} apples and buys {b} more. How many apples does he have?"
    for a, b in zip(range(3, 43), range(7, 47), strict=True)
]


def short_prompt(question: str, workers) -> list[dict]:
    return [
        {"role": "system", "content": "Workers: " + ", ".join(workers) + ". Reply with a workflow."},
        {"role": "user", "content": question},
    ]


def synthetic_examples(n: int, seed: int = 0) -> list[tuple[list[dict], str]]:
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        steps = tuple(
            Step(rng.choice(WORKERS), "Solve the problem.", tuple(range(k)))
            for k in range(rng.randint(1, 2))
        )
        examples.append(
            (short_prompt(QUESTIONS[i % len(QUESTIONS)], WORKERS), render_workflow(Workflow(steps), WORKERS))
        )
    return examples


def format_verdict(text: str, row: dict) -> RolloutVerdict:
    """Toy execution: reward parseable workflows (0.5 under the paper's reward), never correct."""
    return RolloutVerdict(parse_code(text, row["workers"]), correct=False)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny") / "model")


# --- settings ------------------------------------------------------------------------------------


def test_defaults_are_the_papers():
    paper = GRPOSettings()
    assert (paper.num_generations, paper.questions_per_step, paper.max_steps) == (64, 4, 200)
    assert (paper.learning_rate, paper.temperature, paper.beta, paper.save_steps) == (1e-6, 1.0, 0.0, 10)
    assert paper.reward_variant == "paper" and paper.randomize_pools
    assert all(help_text for help_text in settings_help(GRPOSettings).values())
    assert all(help_text for help_text in settings_help(SFTSettings).values())


def _gpu_config(settings: GRPOSettings, tmp_path):
    """The real GRPOConfig where a GPU is lent; elsewhere the same kwargs with bf16 switched off
    (transformers refuses bf16 without a bf16 GPU), so TRL still validates every other knob."""
    import torch

    if torch.cuda.is_available():
        return settings.to_grpo_config(tmp_path)
    kwargs = settings.grpo_config_kwargs(tmp_path)
    assert kwargs["bf16"] is True
    from trl import GRPOConfig

    return GRPOConfig(**{**kwargs, "bf16": False, "use_cpu": True})


def test_gpu_profile_builds_a_vllm_grpo_config(tmp_path):
    settings = GRPOSettings.gpu_profile("Qwen/Qwen2.5-7B-Instruct")
    config = _gpu_config(settings, tmp_path)
    assert config.use_vllm and config.vllm_mode == "colocate"
    assert config.num_generations == 64 and config.learning_rate == 1e-6 and config.beta == 0.0
    assert config.temperature == 1.0 and config.save_steps == 10 and config.max_steps == 200
    # One optimizer step consumes exactly one generation batch: 4 questions x 64 rollouts.
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps == 256
    assert config.generation_batch_size == 256
    assert config.model_init_kwargs == {"dtype": "bfloat16"}
    server = _gpu_config(GRPOSettings.gpu_profile("Qwen/Qwen2.5-1.5B-Instruct", vllm_mode="server"), tmp_path)
    assert server.vllm_mode == "server" and server.vllm_server_base_url.startswith("http://127.0.0.1")


def test_gpu_profile_wraps_7b_class_policies_in_lora_adapters(tmp_path):
    from dataclasses import replace

    from peft import LoraConfig

    seven = GRPOSettings.gpu_profile("Qwen/Qwen2.5-7B-Instruct")
    adapters = seven.peft_config()
    assert isinstance(adapters, LoraConfig) and (adapters.r, adapters.lora_alpha) == (GPU_LORA_RANK, GPU_LORA_ALPHA)
    assert adapters.target_modules == "all-linear" and adapters.task_type == "CAUSAL_LM"
    assert GRPOSettings.gpu_profile() == seven  # the paper's policy is the 7B
    config = _gpu_config(seven, tmp_path)  # adapters change nothing else of the paper's run
    assert config.use_vllm and config.learning_rate == 1e-6 and config.gradient_checkpointing
    assert config.vllm_gpu_memory_utilization == 0.3
    sft = SFTSettings.gpu_profile()
    assert sft.peft_config().r == GPU_LORA_RANK and sft.bf16 and sft.gradient_checkpointing
    # 1.5B fits a full fine-tune: no adapters unless a rank is set.
    assert GRPOSettings.gpu_profile("Qwen/Qwen2.5-1.5B-Instruct").peft_config() is None
    assert SFTSettings.gpu_profile("Qwen/Qwen2.5-1.5B-Instruct").peft_config() is None
    listed = replace(seven, lora=LoraSettings(rank=8, target_modules="q_proj, v_proj")).peft_config()
    assert set(listed.target_modules) == {"q_proj", "v_proj"} and listed.r == 8
    sizes = ["Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "meta-llama/Llama-3.1-405B", "/ckpt/my-policy",
             "smollm2-135m-instruct", "Qwen/Qwen2.5-14B"]
    assert [parameter_billions(m) for m in sizes] == [7.0, 1.5, 405.0, None, None, 14.0]
    assert GRPOSettings.gpu_profile("Qwen/Qwen2.5-14B").lora.rank == GPU_LORA_RANK


def test_cpu_profile_config_and_batch_validation(tmp_path):
    config = GRPOSettings.cpu_profile().to_grpo_config(tmp_path)
    assert not config.use_vllm and not config.bf16 and config.use_cpu
    assert 4 <= config.num_generations <= 8
    with pytest.raises(ValueError, match="divisible"):
        GRPOSettings.cpu_profile(per_device_train_batch_size=3).to_grpo_config(tmp_path)


def test_the_cpu_paper_profile_is_the_papers_rollout_budget_in_one_micro_batch_a_step(tmp_path):
    paper = GRPOSettings.cpu_paper_profile()
    assert (paper.num_generations, paper.questions_per_step, paper.max_steps) == (64, 4, 200)
    assert paper.max_steps * paper.rollouts_per_step == 51_200 and paper.temperature == 1.0
    assert paper.per_device_train_batch_size == paper.rollouts_per_step and paper.share_prompt_prefix
    assert paper.save_steps == 10 and paper.report_to == "tensorboard"
    config = paper.to_grpo_config(tmp_path)
    assert config.gradient_accumulation_steps == 1 and config.num_generations == 64


def test_routing_metrics_say_what_parsed_rollouts_routed_to():
    from conductor_pipeline.training.reward import routing_metrics

    verdicts = [
        RolloutVerdict("ok", True, final_worker="a", fans_out=False, cost_usd=0.001),
        RolloutVerdict("ok", False, final_worker="b", fans_out=True, cost_usd=0.004),
        RolloutVerdict("ok", True, final_worker="a", fans_out=False, cost_usd=0.001),
        RolloutVerdict("schema"),  # unparsed: not routed
        RolloutVerdict("ok", None, final_worker="a", cost_usd=0.5),  # infrastructure failure: not scored
        None,
    ]
    assert routing_metrics(verdicts) == pytest.approx({
        "parsed_accuracy": 2 / 3, "parsed_cost_usd": 0.002, "final_worker/a": 2 / 3, "final_worker/b": 1 / 3,
        "fan_out_share": 1 / 3,
    })
    assert routing_metrics([RolloutVerdict("schema")]) == {}
    assert "fan_out_share" not in routing_metrics([RolloutVerdict("ok", True, final_worker="a")])


def test_sft_batches_examples_of_similar_length_unless_told_not_to(tmp_path):
    assert SFTSettings.cpu_profile().to_sft_config(tmp_path).train_sampling_strategy == "group_by_length"
    assert SFTSettings.cpu_profile(group_by_length=False).to_sft_config(tmp_path).train_sampling_strategy == "random"


# --- reward ----------------------------------------------------------------------------------------


def test_reward_variants_and_infrastructure_failures():
    unparsed, wrong, right = RolloutVerdict("json_decode"), RolloutVerdict("ok", False), RolloutVerdict("ok", True)
    assert [reward_for(v, "paper") for v in (unparsed, wrong, right)] == [0.0, 0.5, 1.0]
    assert [reward_for(v, "strict") for v in (unparsed, wrong, right)] == [0.0, 0.0, 1.0]
    assert reward_for(RolloutVerdict("ok", None)) is None and reward_for(None) is None
    assert reward_for(RolloutVerdict("ok", True, cost_usd=0.1), cost_weight=2.0) == pytest.approx(0.8)


def test_routing_bonus_is_off_by_default_and_only_rewards_beating_w():
    assert routing_bonus(0.2, True) == 0.0
    assert routing_bonus(0.2, True, weight=0.5) == pytest.approx(0.4)
    assert routing_bonus(0.9, False, weight=0.5) == 0.0  # a bonus, never a penalty
    right_despite_w = RolloutVerdict("ok", True, expected_success=0.2)
    assert reward_for(right_despite_w) == 1.0  # the weight defaults to 0: off
    assert reward_for(right_despite_w, bonus_weight=0.5) == pytest.approx(1.4)
    assert reward_for(RolloutVerdict("ok", False, expected_success=0.2), bonus_weight=0.5) == 0.5
    assert reward_for(RolloutVerdict("json_decode", expected_success=0.2), bonus_weight=0.5) == 0.0


def test_reward_function_speaks_trls_calling_convention():
    seen_rows, metrics = [], {}

    def execute(text, row):
        seen_rows.append(row)
        return None if "infra" in text else RolloutVerdict(parse_code(text, row["workers"]), correct=True)

    reward = make_conductor_reward(execute, "strict", group_size=2)
    assert reward.__name__ == REWARD_FUNC_NAME
    good = render_workflow(Workflow((Step("llama-mid", "Solve."),)), WORKERS)
    completions = [[{"role": "assistant", "content": t}] for t in (good, "no lists", "infra", good)]
    rewards = reward(
        prompts=[short_prompt("q", WORKERS)] * 4,
        completions=completions,
        question_id=["a", "a", "b", "b"],
        workers=[WORKERS] * 4,
        trainer_state=object(),
        log_metric=metrics.__setitem__,
    )
    assert rewards == [1.0, 0.0, None, 1.0]
    assert seen_rows[2]["question_id"] == "b" and "trainer_state" not in seen_rows[2]
    assert metrics["conductor/parse_fail_rate"] == 0.25 and metrics["conductor/infra_fail_rate"] == 0.25
    # Group b has one scored rollout: no learning signal, though TRL's zero-std fraction skips it.
    assert metrics["conductor/frac_groups_no_signal"] == 0.5
    assert reward.drain_counts() == {"ok": 2, "no_workflow": 1, "infrastructure": 1}
    assert reward.drain_counts() == {}


def test_async_execute_gives_an_async_reward():
    async def execute(text, row):
        await asyncio.sleep(0)
        return RolloutVerdict("ok", correct=text == "right")

    reward = make_conductor_reward(execute)
    result = asyncio.run(reward(prompts=["p", "p"], completions=["right", "wrong"], workers=[WORKERS] * 2))
    assert result == [1.0, 0.5]
    assert frac_groups_without_signal([1.0, 1.0, 0.0, 0.5], 2) == 0.5


def test_randomised_pools_show_subsets_and_record_them():
    rows = conductor_prompt_rows(
        QUESTIONS, WORKERS, short_prompt, randomize_pools=True, question_id=lambda q: q[:12], seed=3
    )
    assert {len(row["workers"]) for row in rows} == {2, 3}
    for row in rows:
        assert set(row["workers"]) <= set(WORKERS)
        assert ", ".join(row["workers"]) in row["prompt"][0]["content"]
    fixed = conductor_prompt_rows(QUESTIONS[:3], WORKERS, short_prompt, question_id=str)
    assert all(row["workers"] == WORKERS for row in fixed)


def test_randomised_pools_are_drawn_between_the_smallest_and_the_largest_size_asked():
    pool = [f"w{i}" for i in range(11)]
    questions = [f"question {i}" for i in range(200)]
    rows = conductor_prompt_rows(
        questions, pool, short_prompt, randomize_pools=True, min_pool_size=3, max_pool_size=8, question_id=str, seed=0
    )
    assert {len(row["workers"]) for row in rows} == set(range(3, 9))
    assert {w for row in rows for w in row["workers"]} == set(pool)  # every zoo model is shown somewhere
    with pytest.raises(ValueError, match="max_pool_size 2 is below min_pool_size 3"):
        GRPOSettings(min_pool_size=3, max_pool_size=2)


def test_sub_pools_can_be_made_to_keep_each_questions_routing_decision():
    """With must_show, every random sub-pool holds one solver and one failer of its question."""
    pool = ["w0", "w1", "w2", "w3", "w4", "w5"]
    solvers, failers = {"w0", "w1", "w2", "w3", "w4"}, {"w5"}  # the common case: only the weak worker fails
    rows = conductor_prompt_rows(
        QUESTIONS, pool, short_prompt, randomize_pools=True, question_id=str, seed=1,
        must_show=lambda _q: (sorted(solvers), sorted(failers)),
    )
    sizes, failer_positions = set(), set()
    for row in rows:
        shown = row["workers"]
        assert set(shown) & solvers and set(shown) & failers and len(set(shown)) == len(shown)
        sizes.add(len(shown))
        failer_positions.add(shown.index("w5"))
    assert sizes == {2, 3, 4, 5, 6}
    assert len(failer_positions) > 2  # shuffled: the failer is not always at the same ordinal
    free = conductor_prompt_rows(QUESTIONS, pool, short_prompt, randomize_pools=True, question_id=str, seed=1)
    assert any("w5" not in row["workers"] for row in free)  # unconstrained sub-pools drop the decision


def test_cpu_profile_completion_cap_fits_every_compact_warm_start_target(tiny_model):
    """A workflow the warm start teaches must never be truncated by the rollout cap."""
    from transformers import AutoTokenizer

    from conductor_pipeline.conductor.prompt import displayed_worker_names
    from conductor_pipeline.training.synthetic import synthetic_workflows

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    cap = GRPOSettings.cpu_profile().max_completion_length
    workers = [f"w{i}" for i in range(6)]
    longest = max(
        len(tokenizer(target).input_ids) + 1  # + the end-of-turn token
        for _, target in synthetic_workflows(QUESTIONS, workers, n=200, seed=0, style="compact")
    )
    assert longest <= cap
    assert displayed_worker_names(workers, "ordinal")[-1] == "Model 5"


def test_cpu_profile_completion_cap_fits_every_fan_out_target(tiny_model):
    """Three solvers and a vote (the longest compact fan-out) fit the rollout cap too."""
    from transformers import AutoTokenizer

    from conductor_pipeline.conductor.prompt import displayed_worker_names
    from conductor_pipeline.training.synthetic import synthetic_target

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    displayed = displayed_worker_names([f"w{i}" for i in range(7)], "ordinal")
    rng = random.Random(0)
    targets = [
        synthetic_target(rng, displayed, naming="ordinal", style="compact", aggregators=[displayed[6]]) for _ in range(300)
    ]
    assert any(len(parse_workflow(t, displayed).steps) == 4 for t in targets)  # the longest shape was drawn
    longest = max(len(tokenizer(t).input_ids) + 1 for t in targets)  # + the end-of-turn token
    assert longest <= GRPOSettings.cpu_profile().max_completion_length


def test_a_104_token_cap_fits_every_four_solver_fan_out(tiny_model):
    """`max_fan_out: 4` targets (four solvers and the vote) need a longer rollout cap than the
    profile's 80 tokens; 104, the cap the paper-budget run with them uses, fits the longest."""
    from transformers import AutoTokenizer

    from conductor_pipeline.conductor.prompt import displayed_worker_names
    from conductor_pipeline.pools.config import load_pool
    from conductor_pipeline.training.synthetic import synthetic_target

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    pool = load_pool("replay-mixed6-vote")
    displayed = displayed_worker_names(pool.worker_names, "names")
    rng = random.Random(0)
    targets = [synthetic_target(rng, displayed, naming="names", style="compact", aggregators=["majority-vote"],
                                fan_out_only=True, max_fan_out=4) for _ in range(400)]
    lengths = [len(tokenizer(t).input_ids) + 1 for t in targets]  # + the end-of-turn token
    assert max(lengths) <= 104 and max(lengths) > GRPOSettings.cpu_profile().max_completion_length


# --- SFT and GRPO on the tiny model ------------------------------------------------------------


def test_sft_warm_start_lowers_the_loss_and_is_idempotent(tiny_model, tmp_path):
    examples = synthetic_examples(96)
    settings = SFTSettings.cpu_profile(max_steps=12, per_device_train_batch_size=8)
    out = warm_start_sft(tiny_model, examples, settings, tmp_path / "sft")
    losses = [h["loss"] for h in json.loads((out / "sft_log_history.json").read_text()) if "loss" in h]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3
    weights = out / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert warm_start_sft(tiny_model, examples, settings, tmp_path / "sft") == out
    assert weights.stat().st_mtime_ns == mtime


def test_grpo_checkpoints_logs_steps_and_resumes(tiny_model, tmp_path):
    rows = conductor_prompt_rows(QUESTIONS[:8], WORKERS, short_prompt, randomize_pools=True, question_id=str)
    settings = GRPOSettings.cpu_profile(save_steps=2, max_completion_length=24, num_generations=4, questions_per_step=2)
    reward = make_conductor_reward(format_verdict, settings.reward_variant, group_size=settings.num_generations)
    seen = []
    out_dir = tmp_path / "grpo"

    first = train_grpo(tiny_model, rows, reward, settings, out_dir, on_step=seen.append, max_steps_override=3)
    assert first.global_step == 3 and first.resumed_from is None
    # save_steps=2 checkpoints step 2; reaching max_steps saves step 3.
    assert sorted(p.name for p in out_dir.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    assert first.checkpoint_dir == out_dir / "checkpoint-3"
    assert [row["step"] for row in seen] == [1, 2, 3]
    for row in seen:
        assert row["group_size"] == 4
        assert 0.0 <= row["frac_zero_std"] <= 1.0 and 0.0 <= row["parse_fail_rate"] <= 1.0
        assert sum(row["parse_code_counts"].values()) == 8  # 2 questions x 4 rollouts
        assert row["completion_length_mean"] > 0 and row["reward_mean"] is not None

    # Every step's logs reach TensorBoard as the run goes (event files under the run's folder).
    assert list((out_dir / "runs").glob("*/events.out.tfevents.*"))
    # A stopped run rerun with a larger budget continues from the last checkpoint.
    second = train_grpo(tiny_model, rows, reward, settings, out_dir, max_steps_override=4)
    assert second.resumed_from == out_dir / "checkpoint-3"
    assert second.global_step == 4 and [row["step"] for row in second.steps] == [4]
    state = json.loads((out_dir / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    # Rerunning a finished run changes nothing (no extra step, no new checkpoint).
    third = train_grpo(tiny_model, rows, reward, settings, out_dir, max_steps_override=4)
    assert third.global_step == 4 and third.steps == [] and third.checkpoint_dir == out_dir / "checkpoint-4"
    assert not (out_dir / "checkpoint-5").exists()


def test_grpo_early_stop_still_writes_a_checkpoint(tiny_model, tmp_path):
    rows = conductor_prompt_rows(QUESTIONS[:4], WORKERS, short_prompt, question_id=str)
    settings = GRPOSettings.cpu_profile(save_steps=10, max_completion_length=16)
    reward = make_conductor_reward(format_verdict)
    outcome = train_grpo(
        tiny_model, rows, reward, settings, tmp_path / "grpo", on_step=lambda row: row["step"] >= 1
    )
    assert outcome.stopped_early and outcome.global_step == 1
    assert outcome.checkpoint_dir == tmp_path / "grpo" / "checkpoint-1"
    # A checkpoint is a complete policy: the local HF policy loads and samples from it.
    policy = HFLocalPolicy(outcome.checkpoint_dir)
    samples = asyncio.run(policy.propose(short_prompt("q", WORKERS), n=2, temperature=1.0, max_new_tokens=4))
    assert len(samples) == 2


def test_lora_warm_start_is_merged_and_grpo_checkpoints_hold_adapters(tiny_model, tmp_path):
    pytest.importorskip("peft", reason="LoRA needs the peft package (a project dependency): pip install peft")
    lora = LoraSettings(rank=4, alpha=8)
    warm = warm_start_sft(tiny_model, synthetic_examples(16), SFTSettings.cpu_profile(max_steps=2, lora=lora), tmp_path / "sft")
    # The adapters are merged: what GRPO, the parse check and evaluation read is a plain model folder.
    assert (warm / "model.safetensors").is_file() and not (warm / "adapter_config.json").exists()
    rows = conductor_prompt_rows(QUESTIONS[:4], WORKERS, short_prompt, question_id=str)
    settings = GRPOSettings.cpu_profile(max_completion_length=8, num_generations=4, questions_per_step=2, lora=lora)
    outcome = train_grpo(warm, rows, make_conductor_reward(format_verdict), settings, tmp_path / "grpo", max_steps_override=1)
    assert outcome.global_step == 1 and (outcome.checkpoint_dir / "adapter_config.json").is_file()
    policy = HFLocalPolicy(outcome.checkpoint_dir)  # the adapters over the warm-started model they were trained on
    samples = asyncio.run(policy.propose(short_prompt("q", WORKERS), n=2, temperature=1.0, max_new_tokens=4))
    assert len(samples) == 2


def test_sampled_completions_of_a_batching_policy_come_per_row_in_order_each_from_its_own_seed(tiny_model):
    from conductor_pipeline.conductor.hf_policy import HFLocalPolicy
    from conductor_pipeline.training.rollouts import sample_completions

    rows = conductor_prompt_rows(QUESTIONS[:3], WORKERS, short_prompt, question_id=str)
    policy = HFLocalPolicy(tiny_model, device="cpu")
    sampled = asyncio.run(sample_completions(policy, rows, 2, 12))
    assert [row["question_id"] for row, _ in sampled] == [row["question_id"] for row in rows for _ in range(2)]
    again = asyncio.run(sample_completions(policy, rows, 2, 12))
    assert [out.text for _, out in sampled] == [out.text for _, out in again]
    # Each sample has a seed of its own: a row's samples are not one text repeated.
    assert any(sampled[2 * i][1].text != sampled[2 * i + 1][1].text for i in range(len(rows)))


def test_parse_checks_and_the_frozen_conductor_load_the_policy_on_the_device_given(monkeypatch, tiny_model):
    from conductor_pipeline.conductor.hf_policy import HFLocalPolicy
    from conductor_pipeline.pools.config import load_pool
    from conductor_pipeline.training import rollouts

    devices: list[str] = []

    class RecordingPolicy(HFLocalPolicy):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            devices.append(self.device)

    monkeypatch.setattr(rollouts, "HFLocalPolicy", RecordingPolicy)
    rows = conductor_prompt_rows(QUESTIONS[:1], WORKERS, short_prompt, question_id=str)
    rate, codes = rollouts.parse_check(tiny_model, rows, "ordinal", 8, 2, device="cpu")
    assert devices == ["cpu"] and sum(codes.values()) == 2 and 0.0 <= rate <= 1.0
    assert rollouts.frozen_conductor(load_pool("replay-mixed6-recursive"), tiny_model, "cpu").device == "cpu"
    with pytest.raises(ValueError, match="device must be"):
        rollouts.parse_check(tiny_model, rows, "ordinal", 8, 2, device="gpu")


def test_a_ranked_sub_pool_lists_its_workers_by_predicted_success_after_the_draw():
    pool = ["w0", "w1", "w2", "w3", "w4", "w5"]
    predicted = {"w0": 0.1, "w1": 0.9, "w2": 0.5, "w3": 0.7, "w4": 0.3, "w5": 0.6}
    rows = conductor_prompt_rows(
        QUESTIONS, pool, short_prompt, randomize_pools=True, question_id=str, seed=2,
        order=lambda _q, shown: sorted(shown, key=lambda w: -predicted[w]),
    )
    drawn = conductor_prompt_rows(QUESTIONS, pool, short_prompt, randomize_pools=True, question_id=str, seed=2)
    for row, unranked in zip(rows, drawn, strict=True):
        assert sorted(row["workers"]) == sorted(unranked["workers"])  # the same draw, reordered
        assert row["workers"] == sorted(row["workers"], key=lambda w: -predicted[w])
        assert ", ".join(row["workers"]) in row["prompt"][0]["content"]
