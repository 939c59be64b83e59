"""The evaluation assets' run config hands the library its settings whole."""

from __future__ import annotations

from assets.evaluation_config import EvalArmsConfig
from conductor_pipeline.evaluation.slices import DEFAULT_SLICE_SIZE, SliceSpec
from resources.conductor import ConductorPolicyResource


def test_the_slice_spec_carries_every_slice_setting_of_the_config() -> None:
    config = EvalArmsConfig(
        corpus="gsm8k", splits=["train", "test"], math_levels=[4, 5], slice_size=7, order="hashed", only_recorded=False
    )
    assert config.slice_spec() == SliceSpec(
        corpus="gsm8k", splits=("train", "test"), math_levels=(4, 5), size=7, order="hashed", only_recorded=False
    )
    assert EvalArmsConfig().slice_spec() == SliceSpec("math", ("test",), (5,), DEFAULT_SLICE_SIZE, "question_id", True)


def test_the_train_split_w_is_fitted_only_when_an_arm_uses_it() -> None:
    plain, with_w = ConductorPolicyResource(), ConductorPolicyResource(show_predicted_success=True)
    no_router = EvalArmsConfig(world_model_router=False, w_cascade=False)
    assert not no_router.needs_world_model([plain])
    assert no_router.needs_world_model([plain, with_w])
    assert EvalArmsConfig(w_cascade=False).needs_world_model([])
    assert EvalArmsConfig(world_model_router=False).needs_world_model([])
