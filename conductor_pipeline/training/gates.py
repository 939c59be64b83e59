"""The zero-variance gate: aim a GPU-hour at GRPO only when the probe shows a gradient.

GRPO's advantage is a reward minus its group's mean: a group whose rollouts all score the same
contributes nothing. The reproduced project's rule is a short probe run (20 steps) and a full
run only if *strictly fewer* than 20% of the probe's groups had zero reward variance (a tie
fails). The verdict is persisted as a small JSON file so that training in a LATER run can check
it, not just the run that evaluated it; the file names the probe run it judged, so a verdict
on an older probe never opens the gate for a newer one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from conductor_pipeline.paths import write_json_atomic

# The reproduction's threshold: ship the full run only if strictly fewer than 20% of groups are flat.
ZERO_VARIANCE_THRESHOLD = 0.20
ZERO_VARIANCE_GATE = "zero_variance_gate"


class GateClosedError(RuntimeError):
    """Training was asked to start while its gate is failed, missing, or judged another probe."""


@dataclass(frozen=True)
class GateVerdict:
    """One evaluation of a gate over one probe run, as persisted next to the checkpoints."""

    gate: str
    probe_run_id: str
    passed: bool
    figure: float  # the measured fraction of zero-variance groups over the probe
    threshold: float
    group_size: int
    steps: int
    groups: int
    evaluated_at: str
    detail: str

    def describe(self) -> str:
        word = "passed" if self.passed else "FAILED"
        return (
            f"{self.gate} {word}: {self.figure:.3f} of {self.groups} groups (group size {self.group_size}, "
            f"{self.steps} steps) had zero reward variance; must be strictly below {self.threshold:.2f}"
        )


def _flat_fraction(row: Mapping[str, object]) -> float:
    """A step's share of groups without signal; a step that logged none counts as all flat.

    `frac_groups_no_signal` (ours) also counts groups left with < 2 scorable rollouts after
    infrastructure exclusions, which TRL's `frac_reward_zero_std` does not; prefer it.
    """
    for key in ("frac_groups_no_signal", "frac_zero_std"):
        value = row.get(key)
        if isinstance(value, int | float) and not math.isnan(float(value)):
            return float(value)
    return 1.0


def evaluate_zero_variance(
    step_rows: Iterable[Mapping[str, object]],
    *,
    probe_run_id: str,
    group_size: int,
    groups_per_step: int,
    threshold: float = ZERO_VARIANCE_THRESHOLD,
) -> GateVerdict:
    """Pool the probe's steps (equal groups per step, so the mean of step fractions) and judge it."""
    fractions = [_flat_fraction(row) for row in step_rows]
    if not fractions:
        figure, detail = 1.0, "the probe logged no steps: no evidence of a gradient"
    else:
        figure, detail = sum(fractions) / len(fractions), f"per-step fractions: {[round(f, 3) for f in fractions]}"
    return GateVerdict(
        gate=ZERO_VARIANCE_GATE,
        probe_run_id=probe_run_id,
        passed=figure < threshold,  # strictly below: a tie fails
        figure=figure,
        threshold=threshold,
        group_size=group_size,
        steps=len(fractions),
        groups=len(fractions) * groups_per_step,
        evaluated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        detail=detail,
    )


def write_verdict(path: str | Path, verdict: GateVerdict) -> None:
    """Write atomically: a half-written verdict must never read as a pass."""
    write_json_atomic(path, asdict(verdict))


def read_verdict(path: str | Path) -> GateVerdict | None:
    path = Path(path)
    if not path.is_file():
        return None
    return GateVerdict(**json.loads(path.read_text()))


def require_open(verdict: GateVerdict | None, probe_run_id: str | None) -> GateVerdict:
    """The verdict if it passed on the latest probe run; otherwise GateClosedError saying why."""
    if probe_run_id is None:
        raise GateClosedError("no GRPO probe run is recorded: materialize grpo_probe_run (and its gate) first")
    if verdict is None:
        raise GateClosedError(f"{ZERO_VARIANCE_GATE} has not been evaluated: probe run {probe_run_id} has no verdict")
    if verdict.probe_run_id != probe_run_id:
        raise GateClosedError(
            f"{ZERO_VARIANCE_GATE} last judged probe run {verdict.probe_run_id}, but the latest probe run is "
            f"{probe_run_id}: evaluate the gate on the latest probe before training"
        )
    if not verdict.passed:
        raise GateClosedError(f"training refused: {verdict.describe()}. Fix the contested set or the warm start, "
                              "rerun grpo_probe_run, and train once the gate passes")
    return verdict
