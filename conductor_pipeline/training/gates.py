"""The zero-variance gate: aim a GPU-hour at GRPO only when the probe shows a gradient.

GRPO's advantage is a reward minus its group's mean: a group whose rollouts all score the same
contributes nothing. The rule: a short probe run (20 steps) and a full run only if *strictly
fewer* than 20% of the probe's groups had zero reward variance (a tie fails). The verdict is
persisted as a small JSON file so that training in a LATER run can check it, not just the run
that evaluated it; the file names the probe run it judged, so a verdict on an older probe never
opens the gate for a newer one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conductor_pipeline.paths import write_json_atomic

# Ship the full run only if strictly fewer than 20% of the probe's groups are flat (no gradient).
ZERO_VARIANCE_THRESHOLD = 0.20
ZERO_VARIANCE_GATE = "zero_variance_gate"
# The latest probe run of a pool (its id, group size, per-step figures), next to its run folders.
PROBE_MANIFEST = "latest_probe.json"


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

    def summary(self) -> dict[str, object]:
        """The figures a reader of the check or of the checkpoint it licensed needs."""
        return {
            "zero_variance_fraction": self.figure,
            "group_size": self.group_size,
            "groups": self.groups,
            "steps": self.steps,
            "threshold": self.threshold,
            "probe_run_id": self.probe_run_id,
        }


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


def judge_probe(
    manifest: Mapping[str, Any], logged_steps: Iterable[Mapping[str, object]], threshold: float = ZERO_VARIANCE_THRESHOLD
) -> GateVerdict:
    """The gate over a probe run: its logged `training_steps` rows (TRL's flat-group figure) joined
    with the probe manifest's per-step `frac_groups_no_signal` (ours, which the verdict prefers)."""
    no_signal = {s["step"]: s.get("frac_groups_no_signal") for s in manifest["steps"]}
    rows = [{"frac_zero_std": r["frac_zero_std"], "frac_groups_no_signal": no_signal.get(r["step"])} for r in logged_steps]
    return evaluate_zero_variance(
        rows, probe_run_id=manifest["probe_run_id"], group_size=manifest["group_size"],
        groups_per_step=manifest["groups_per_step"], threshold=threshold,
    )


def write_verdict(path: str | Path, verdict: GateVerdict) -> None:
    """Write atomically: a half-written verdict must never read as a pass."""
    write_json_atomic(path, asdict(verdict))


def read_verdict(path: str | Path) -> GateVerdict | None:
    path = Path(path)
    if not path.is_file():
        return None
    return GateVerdict(**json.loads(path.read_text()))


def probe_manifest(
    probe_run_id: str,
    step_rows: Iterable[Mapping[str, Any]],
    *,
    group_size: int,
    groups_per_step: int,
    **facts: Any,
) -> dict[str, Any]:
    """What the gate judges a probe run by: its id, group shape and per-step flat-group figures
    (TRL's `frac_zero_std` and ours), plus `facts` a reader wants next to them."""
    steps = [
        {"step": s["step"], "frac_zero_std": s["frac_zero_std"], "frac_groups_no_signal": s["frac_groups_no_signal"]}
        for s in step_rows
    ]
    return {"probe_run_id": probe_run_id, **facts, "group_size": group_size, "groups_per_step": groups_per_step,
            "steps": steps}


def write_probe_manifest(probe_dir: str | Path, manifest: Mapping[str, Any]) -> Path:
    """Record the latest probe run; the gate and training read it to know which probe is current."""
    path = Path(probe_dir) / PROBE_MANIFEST
    write_json_atomic(path, manifest)
    return path


def read_probe_manifest(probe_dir: str | Path) -> dict | None:
    """The latest probe run's manifest, or None when no probe ran."""
    path = Path(probe_dir) / PROBE_MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


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
