"""The trainer resource is the library's settings, profile plus overrides: one name and one help
text per knob, so the Dagster UI and the library can never drift apart."""

from __future__ import annotations

from dataclasses import fields

from conductor_pipeline.training.settings import GRPOSettings, LoraSettings, SFTSettings, settings_help
from resources.trainer import GRPO_OVERRIDES, SFTOverrides, TrainerResource

# Library field names the resource owns itself: a profile-dependent default, or one seed for everything.
RESOURCE_OWNED = {"policy_model", "seed"}


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
    assert TrainerResource().grpo_settings() == GRPOSettings.cpu_profile()
    assert TrainerResource().sft_settings() == SFTSettings.cpu_profile()
    gpu = TrainerResource(profile="gpu")
    assert gpu.grpo_settings() == GRPOSettings.gpu_profile()
    assert gpu.sft_settings() == SFTSettings.gpu_profile()

    trainer = TrainerResource(num_generations=4, max_steps=7, sft=SFTOverrides(max_steps=5, learning_rate=0.3), seed=2)
    settings, sft = trainer.grpo_settings(), trainer.sft_settings()
    assert (settings.num_generations, settings.max_steps, settings.seed) == (4, 7, 2)
    assert (sft.max_steps, sft.learning_rate, sft.seed) == (5, 0.3, 2)
    assert trainer.grpo_settings(steps=3).max_steps == 3  # the probe's step count wins
    unchanged = {f.name for f in fields(GRPOSettings)} - {"num_generations", "max_steps", "seed"}
    cpu = GRPOSettings.cpu_profile()
    assert all(getattr(settings, name) == getattr(cpu, name) for name in unchanged)


def test_the_smollm2_profile_and_lora_are_the_librarys_settings():
    smollm2 = TrainerResource(profile="cpu-smollm2")
    assert smollm2.grpo_settings() == GRPOSettings.cpu_smollm2_profile()
    assert smollm2.sft_settings() == SFTSettings.cpu_smollm2_profile()
    assert smollm2.grpo_settings().policy_model == "smollm2-135m-instruct"
    assert (smollm2.warm_start_style, smollm2.n_prompt_examples) == ("paper", 0)  # the GPU profile's style
    lora = TrainerResource(lora_rank=8, lora_alpha=16)
    assert lora.grpo_settings().lora == lora.sft_settings().lora == LoraSettings(rank=8, alpha=16)
    assert TrainerResource().grpo_settings().lora.rank == 0  # full fine-tuning by default
    lora_help = settings_help(LoraSettings)
    assert TrainerResource.model_fields["lora_rank"].description == lora_help["rank"]
    assert TrainerResource.model_fields["lora_alpha"].description == lora_help["alpha"]
    assert TrainerResource().gate_on == "reward"
