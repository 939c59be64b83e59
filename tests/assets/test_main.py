"""`make run` tells a closed gate (a result) from a broken step (a fault)."""

from __future__ import annotations

from dagster._utils.error import SerializableErrorInfo

from assets.main import is_blocking_check_failure


def error(cls_name: str, cause: SerializableErrorInfo | None = None) -> SerializableErrorInfo:
    return SerializableErrorInfo(message=f"{cls_name}: boom", stack=[], cls_name=cls_name, cause=cause)


def test_a_failed_blocking_check_is_a_gate_not_a_fault():
    assert is_blocking_check_failure(error("DagsterAssetCheckFailedError"))
    assert is_blocking_check_failure(error("DagsterExecutionStepExecutionError", error("DagsterAssetCheckFailedError")))


def test_any_other_step_error_is_a_fault():
    assert not is_blocking_check_failure(error("ValueError"))
    assert not is_blocking_check_failure(error("DagsterExecutionStepExecutionError", error("KeyError")))
