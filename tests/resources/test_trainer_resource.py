"""The trainer resource is the library's settings, profile plus overrides: one name and one help
text per knob, so the Dagster UI and the library can never drift apart."""

from __future__ import annotations

from dataclasses import fields

import pytest

from conductor_pipeline.training.settings import (
    GPU_LORA_ALPHA,
    GPU_LORA_RANK,
    GRPOSettings,
    LoraSettings,
    SFTSettings,
    settings_help,
)
from conductor_pipeline.conductor.prompt import PromptSpec
from conductor_pipeline.training.recipe import RecipeError
from resources.conductor import ConductorPolicyResource
from resources.trainer import GRPO_OVERRIDES, SFTOverrides, TrainerResource

# Library field names the resource owns itself: a profile-dependent default, or one seed for everything.
RESOURCE_OWNED = {"policy_model", "seed"}
POOL = "replay-mixed6"


def test_every_override_has_the_library_name_and_help_text():
    grpo_help, sft_help = settings_help(GRPOSettings), settings_help(SFTSettings)
    resource_fields = TrainerResource.model_fields
    assert set(GRPO_OVERRIDES) == (set(resource_fields) & set(grpo_help)) - RESOURCE_OWNED
    for name in GRPO_OVERRIDES:
        assert resource_fields[name].description == grpo_help[name], name
    assert set(SFTOverrides.model_fields) <= set(sft_help)
    for name, spec in SFTOverrides.model_fields.items():
        assert spec.description == sft_help[name], name


def test_empty_overrides_keep_the_profile_and_set_ones_replace_it():
    assert TrainerResource().recipe().grpo == GRPOSettings.cpu_profile(constrained_decoding=True)  # the cpu profile samples constrained
    assert TrainerResource().recipe().sft == SFTSettings.cpu_profile()
    gpu = TrainerResource(profile="gpu")
    assert gpu.recipe().grpo == GRPOSettings.gpu_profile()
    assert gpu.recipe().sft == SFTSettings.gpu_profile()

    trainer = TrainerResource(num_generations=4, max_steps=7, sft=SFTOverrides(max_steps=5, learning_rate=0.3), seed=2)
    settings, sft = trainer.recipe().grpo, trainer.recipe().sft
    assert (settings.num_generations, settings.max_steps, settings.seed) == (4, 7, 2)
    assert (sft.max_steps, sft.learning_rate, sft.seed) == (5, 0.3, 2)
    assert trainer.model_copy(update={"probe_steps": 3}).recipe().probe().max_steps == 3  # the probe's step count
    # The cpu profile's micro-batch is one whole step, so that every rollout's prompt is shared.
    assert settings.per_device_train_batch_size == settings.rollouts_per_step == 4 * settings.questions_per_step
    unchanged = {f.name for f in fields(GRPOSettings)} - {"num_generations", "max_steps", "seed", "per_device_train_batch_size"}
    cpu = GRPOSettings.cpu_profile(constrained_decoding=True)
    assert all(getattr(settings, name) == getattr(cpu, name) for name in unchanged)


def test_the_smollm2_profile_and_lora_are_the_librarys_settings():
    smollm2 = TrainerResource(profile="cpu-smollm2")
    assert smollm2.recipe().grpo == GRPOSettings.cpu_smollm2_profile()
    assert smollm2.recipe().sft == SFTSettings.cpu_smollm2_profile()
    assert smollm2.recipe().grpo.policy_model == "smollm2-135m-instruct"
    assert (smollm2.recipe().warm_start.style, smollm2.recipe().prompt.n_examples) == ("paper", 0)  # the GPU profile's style
    lora = TrainerResource(lora_rank=8, lora_alpha=16)
    assert lora.recipe().grpo.lora == lora.recipe().sft.lora == LoraSettings(rank=8, alpha=16)
    assert TrainerResource().recipe().grpo.lora.rank == 0  # full fine-tuning by default
    lora_help = settings_help(LoraSettings)
    assert TrainerResource.model_fields["lora_rank"].description == lora_help["rank"]
    assert TrainerResource.model_fields["lora_alpha"].description == lora_help["alpha"]
    assert TrainerResource().gate_on == "reward"


def test_cost_weight_reaches_the_reward_settings():
    assert TrainerResource().recipe().grpo.cost_weight == 0.0  # off by default: the paper's reward
    assert TrainerResource(cost_weight=2.5).recipe().grpo.cost_weight == 2.5
    assert TrainerResource(profile="gpu", cost_weight=1.0).recipe().grpo.cost_weight == 1.0


def test_one_device_setting_resolves_once_and_trl_follows_it(monkeypatch):
    import torch

    # The default is auto on the trainer and on the eval conductor alike.
    assert TrainerResource().device == ConductorPolicyResource().device == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = TrainerResource()
    assert cpu.resolved_device == "cpu" and cpu.training_device() == "cpu"
    assert cpu.recipe().grpo.use_cpu and cpu.recipe().sft.use_cpu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu_box = TrainerResource()  # the cpu profile on a machine with a GPU trains there
    assert gpu_box.resolved_device == "cuda"
    assert not gpu_box.recipe().grpo.use_cpu and not gpu_box.recipe().sft.use_cpu
    assert TrainerResource(device="cpu").recipe().grpo.use_cpu  # pinned to the CPU all the same
    assert not TrainerResource(device="cuda:1").recipe().grpo.use_cpu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="the gpu profile needs a GPU"):
        TrainerResource(profile="gpu").training_device()
    assert not TrainerResource(profile="gpu").recipe().grpo.use_cpu  # the gpu profile never trains on a CPU
    with pytest.raises(ValueError, match="pattern"):
        TrainerResource(device="gpu")
    # The eval conductor takes the same setting; its local policy resolves it when built (lazily loaded).
    with pytest.raises(ValueError, match="pattern"):
        ConductorPolicyResource(device="cuda:")
    policy = ConductorPolicyResource(kind="hf_local", model_path="/checkpoints/policy").build_policy()
    assert policy.device == "cpu"
    assert ConductorPolicyResource(kind="hf_local", model_path="/p", device="cuda:1").build_policy().device == "cuda:1"
    assert ConductorPolicyResource(device="cuda:1").with_checkpoint("/p").device == "cuda:1"


def test_gpu_profile_trains_adapters_for_7b_class_policies_only():
    paper = TrainerResource(profile="gpu")  # Qwen2.5-7B-Instruct
    adapters = LoraSettings(rank=GPU_LORA_RANK, alpha=GPU_LORA_ALPHA)
    assert paper.recipe().grpo.lora == paper.recipe().sft.lora == adapters
    small = TrainerResource(profile="gpu", policy_model="Qwen/Qwen2.5-1.5B-Instruct")
    assert small.recipe().grpo.lora.rank == small.recipe().sft.lora.rank == 0  # full fine-tuning
    assert small.recipe().grpo == GRPOSettings.gpu_profile("Qwen/Qwen2.5-1.5B-Instruct")
    assert small.recipe().sft == SFTSettings.gpu_profile("Qwen/Qwen2.5-1.5B-Instruct")
    # Set fields win over the profile's choice, both ways.
    assert TrainerResource(profile="gpu", lora_rank=0).recipe().grpo.lora.rank == 0
    chosen = TrainerResource(profile="gpu", policy_model="Qwen/Qwen2.5-1.5B-Instruct", lora_rank=16, lora_target_modules="q_proj,v_proj")
    assert chosen.recipe().grpo.lora == LoraSettings(rank=16, target_modules="q_proj,v_proj")
    assert TrainerResource(lora_alpha=8).recipe().grpo.lora.rank == 0  # the cpu profile has none to scale
    assert TrainerResource.model_fields["lora_target_modules"].description == settings_help(LoraSettings)["target_modules"]


def test_the_trainer_profile_comes_from_the_environment_unless_configured(monkeypatch):
    monkeypatch.setenv("CORYPHAEUS_TRAINER_PROFILE", "cpu-paper")
    assert TrainerResource().profile == "cpu-paper"
    assert TrainerResource().recipe().grpo == GRPOSettings.cpu_paper_profile()
    assert TrainerResource(profile="cpu").recipe().grpo == GRPOSettings.cpu_profile(constrained_decoding=True)
    monkeypatch.delenv("CORYPHAEUS_TRAINER_PROFILE")
    assert TrainerResource().profile == "cpu"


def test_the_overrides_keep_the_librarys_bounds():
    # Derived from the knobs GRPOSettings / SFTSettings / LoraSettings declare overridable.
    for bad in ({"num_generations": 1}, {"learning_rate": 0.0}, {"max_completion_length": 7}, {"lora_alpha": 0}):
        with pytest.raises(ValueError):
            TrainerResource(**bad)
    with pytest.raises(ValueError):
        SFTOverrides(max_steps=0)
    assert TrainerResource().reward_variant == GRPOSettings().reward_variant  # Literal knobs: the library's default


def test_constrained_decoding_is_recorded_in_the_trained_prompt_and_needs_the_lists_only_warm_start():
    trainer = TrainerResource(profile="cpu-paper", constrained_decoding=True)
    recipe = trainer.recipe()
    assert recipe.grpo.constrained_decoding and recipe.prompt.constrained_decoding is True
    assert TrainerResource(profile="cpu-paper").recipe().prompt.constrained_decoding is False
    checkpoint = ConductorPolicyResource().with_checkpoint("ckpt", recipe.prompt)
    assert checkpoint.constrained_decoding and checkpoint.build_policy().constrained  # evaluated as trained
    with pytest.raises(RecipeError, match="synthetic_style: compact"):
        TrainerResource(profile="cpu-smollm2", constrained_decoding=True).recipe()


def test_fan_outs_only_is_recorded_in_the_trained_prompt_changes_the_eval_id_and_needs_constrained_decoding(tmp_path):
    trainer = TrainerResource(profile="cpu-paper", constrained_decoding=True, fan_outs_only=True)
    prompt = trainer.recipe().prompt
    assert prompt.fan_outs_only is True
    (tmp_path / "model.safetensors").write_bytes(b"weights")  # what the eval id digests
    checkpoint = ConductorPolicyResource().with_checkpoint(str(tmp_path), prompt)
    policy = checkpoint.build_policy(["majority-vote"])
    assert policy.constrained and policy.fan_outs_only and policy.aggregators == ("majority-vote",)
    # A record from before the knob is sampled without it, and keeps its eval id.
    before = PromptSpec.model_validate({k: v for k, v in prompt.model_dump().items() if k != "fan_outs_only"})
    old = ConductorPolicyResource().with_checkpoint(str(tmp_path), before)
    assert not old.fan_outs_only
    assert old.fingerprint() != checkpoint.fingerprint()
    assert old.fingerprint() == old.model_copy(update={"fan_outs_only": False}).fingerprint()
    with pytest.raises(ValueError, match="constrained_decoding: true"):
        TrainerResource(profile="cpu-paper", fan_outs_only=True).recipe()


def test_each_seed_keeps_its_own_folders_so_seed_runs_resume_without_retraining_each_other(tmp_path):
    seeds = [TrainerResource(output_root=str(tmp_path), seed=seed) for seed in (0, 1)]
    folders = [
        (t.warm_start_dir(POOL), t.probe_dir(POOL), t.gate_path(POOL), t.checkpoint_dir(POOL)) for t in seeds
    ]
    for first, second in zip(*folders):
        assert first != second
    assert all(path.is_relative_to(tmp_path / POOL / "seed-1") for path in folders[1])
    assert seeds[1].recipe().grpo.seed == seeds[1].recipe().sft.seed == 1
    # The folder names the arms: a seed's warm start is evaluated under the same arm name as any other's.
    assert folders[0][0].name == folders[1][0].name == "warm_start"


def test_the_default_recipe_reads_a_ranked_catalogue_and_a_profile_keeps_its_own_gate():
    recipe = TrainerResource(profile="cpu").recipe()
    assert recipe.prompt == PromptSpec(
        naming="ordinal", n_examples=0, max_new_tokens=80, show_predicted_success=True, ranked_catalogue=True,
        constrained_decoding=True,
    )
    assert recipe.gate.zero_variance_threshold == 0.35
    paper = TrainerResource(profile="cpu-paper").recipe()
    assert not paper.prompt.ranked_catalogue and paper.gate.zero_variance_threshold == 0.20
    assert TrainerResource(profile="cpu", zero_variance_threshold=0.1).recipe().gate.zero_variance_threshold == 0.1
    with pytest.raises(RecipeError, match="needs show_predicted_success"):
        TrainerResource(profile="cpu", show_predicted_success=False).recipe()
    unranked = TrainerResource(profile="cpu", ranked_catalogue=False).recipe().prompt
    assert unranked.show_predicted_success and not unranked.ranked_catalogue
