"""The zero-variance gate: strict, bound to the latest probe, and honest about a probe too small to
decide (a share of 40 groups near the threshold is mostly noise)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from conductor_pipeline.stats import wilson_interval
from conductor_pipeline.training.gates import (
    GateClosedError,
    evaluate_zero_variance,
    groups_to_decide,
    read_verdict,
    require_open,
    write_verdict,
)

# The default recipe's probe: 20 steps of 2 groups, judged against 0.35.
GROUPS, THRESHOLD = 40, 0.35


def probe(flat_groups: int, groups: int = GROUPS):
    return evaluate_zero_variance([{"frac_zero_std": flat_groups / groups}], probe_run_id="p", group_size=8,
                                  groups_per_step=groups, threshold=THRESHOLD)


def test_gate_is_strict_and_bound_to_the_latest_probe():
    def verdict(figure: float, run: str = "p1"):
        return evaluate_zero_variance([{"frac_zero_std": figure}], probe_run_id=run, group_size=64, groups_per_step=4)

    assert not verdict(0.20).passed  # a tie fails
    assert verdict(0.19).passed and not verdict(0.5).passed
    assert not evaluate_zero_variance([], probe_run_id="p", group_size=4, groups_per_step=2).passed
    # ours (groups with < 2 scorable rollouts count as flat) wins over TRL's figure
    assert not evaluate_zero_variance(
        [{"frac_zero_std": 0.0, "frac_groups_no_signal": 0.5}], probe_run_id="p", group_size=4, groups_per_step=2
    ).passed
    assert require_open(verdict(0.1), "p1").passed
    with pytest.raises(GateClosedError, match="latest probe run is p2"):
        require_open(verdict(0.1), "p2")
    with pytest.raises(GateClosedError, match="training refused"):
        require_open(verdict(0.3), "p1")
    with pytest.raises(GateClosedError, match="no GRPO probe run"):
        require_open(None, None)


@pytest.mark.parametrize(("flat_groups", "passed"), [(2, True), (8, True), (30, False)])
def test_a_figure_far_from_the_threshold_is_decided(flat_groups: int, passed: bool) -> None:
    verdict = probe(flat_groups)
    low, high = verdict.interval
    assert verdict.passed is passed and verdict.decided
    assert (high < THRESHOLD) if passed else (low >= THRESHOLD)
    assert "the probe decided" in verdict.describe()


@pytest.mark.parametrize("flat_groups", [12, 14, 16])  # 0.300 passed, 0.350 failed on a tie, 0.400 failed
def test_a_figure_near_the_threshold_passes_or_fails_as_before_but_says_the_probe_could_not_tell(
    flat_groups: int,
) -> None:
    verdict = probe(flat_groups)
    assert verdict.passed is (flat_groups / GROUPS < THRESHOLD)  # the rule is unchanged
    low, high = verdict.interval
    assert low < THRESHOLD <= high and verdict.decided is False
    assert "a probe this size cannot tell" in verdict.describe()
    assert verdict.summary()["decided"] is False and verdict.summary()["interval"] == [low, high]


@pytest.mark.parametrize("figure", [0.1, 0.3, 0.4, 0.6])
def test_groups_to_decide_is_the_fewest_whose_interval_clears_the_threshold(figure: float) -> None:
    def clear(groups: int) -> bool:
        low, high = (float(end) for end in wilson_interval(figure * groups, groups))
        return high < THRESHOLD if figure < THRESHOLD else low >= THRESHOLD

    needed = groups_to_decide(figure, THRESHOLD)
    assert needed is not None and clear(needed) and not clear(needed - 1)


def test_a_figure_on_the_threshold_is_never_decided() -> None:
    assert groups_to_decide(THRESHOLD, THRESHOLD) is None
    assert "no probe size decides at this figure" in probe(14).describe()


def test_the_interval_survives_the_verdict_file_and_an_older_file_still_loads(tmp_path: Path) -> None:
    verdict = probe(12)
    write_verdict(tmp_path / "gate.json", verdict)
    assert read_verdict(tmp_path / "gate.json") == verdict
    older = {key: value for key, value in asdict(verdict).items() if key != "interval"}
    (tmp_path / "old.json").write_text(json.dumps(older))
    old = read_verdict(tmp_path / "old.json")
    assert old.passed and old.decided is None and "Wilson" not in old.describe()
