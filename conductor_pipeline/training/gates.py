"""The zero-variance gate: aim a GPU-hour at GRPO only when the probe shows a gradient.

GRPO's advantage is a reward minus its group's mean: a group whose rollouts all score the same
contributes nothing. The rule: a short probe run (20 steps) and a full run only if *strictly
fewer* than 20% of the probe's groups had zero reward variance (a tie fails). The verdict is
persisted as a small JSON file so that training in a LATER run can check it, not just the run
that evaluated it; the file names the probe run it judged, so a verdict on an older probe never
opens the gate for a newer one.

Reward variance counts a group as live when its rollouts differ only in format (0 unparseable vs
0.5 parsed but wrong): such a group teaches the format, not routing. So every verdict also
reports the routing-signal figure, the share of groups whose rollouts all have the same
correctness (format ignored), and `gate_on="correctness"` judges by that figure instead.

A probe's figure is a share of a few dozen groups, so near the threshold it is mostly noise: the
verdict still follows the figure, but it also carries the figure's Wilson interval and says whether
the probe *decided* (the interval lies on one side of the threshold) or not, and how many groups
would decide at that figure. An undecided gate may go the other way on another seed or CPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from conductor_pipeline.files import read_json_checked, write_json_atomic
from conductor_pipeline.stats import wilson_interval

# Ship the full run only if strictly fewer than 20% of the probe's groups are flat (no gradient).
ZERO_VARIANCE_THRESHOLD = 0.20
ZERO_VARIANCE_GATE = "zero_variance_gate"
# What the gate judges: groups with equal rewards (the default rule), or groups with equal
# correctness, format ignored (no routing signal).
GateOn = Literal["reward", "correctness"]
GATE_ON_REWARD: GateOn = "reward"
# The latest probe run of a pool (its id, group size, per-step figures), next to its run folders.
PROBE_MANIFEST = "latest_probe.json"
# In a probe run's own folder: written when the run finished, so a rerun of the same inputs reuses it.
RUN_MANIFEST = "probe_manifest.json"


class GateClosedError(RuntimeError):
    """Training was asked to start while its gate is failed, missing, or judged another probe."""


@dataclass(frozen=True)
class GateVerdict:
    """One evaluation of a gate over one probe run, as persisted next to the checkpoints."""

    gate: str
    probe_run_id: str
    passed: bool
    figure: float  # the judged fraction of groups without signal (see `gate_on`)
    threshold: float
    group_size: int
    steps: int
    groups: int
    evaluated_at: str
    detail: str
    # Defaults, so verdicts written before these fields still load (they judged reward variance).
    gate_on: str = GATE_ON_REWARD
    reward_figure: float | None = None  # share of groups with zero reward variance
    correctness_figure: float | None = None  # share of groups with one correctness (no routing signal)
    # The judged figure's 95% Wilson interval over `groups`; None in verdicts written before it.
    interval: tuple[float, float] | None = None

    @property
    def decided(self) -> bool | None:
        """Whether the probe was large enough to tell: the interval lies wholly on the verdict's
        side of the threshold. None for verdicts written before intervals were kept."""
        if self.interval is None:
            return None
        low, high = self.interval
        return high < self.threshold if self.passed else low >= self.threshold

    def describe(self) -> str:
        word = "passed" if self.passed else "FAILED"
        reward = self.figure if self.reward_figure is None else self.reward_figure
        routing = "not measured" if self.correctness_figure is None else f"{self.correctness_figure:.3f}"
        return (
            f"{self.gate} {word}: {reward:.3f} of {self.groups} groups (group size {self.group_size}, "
            f"{self.steps} steps) had zero reward variance, {routing} had the same correctness in every "
            f"rollout (no routing signal); judged on {self.gate_on}: {self.figure:.3f} must be strictly "
            f"below {self.threshold:.2f}{self.describe_interval()}"
        )

    def describe_interval(self) -> str:
        """'; 95% interval [a, b]: decided' or what an undecided probe would have needed ('' if unknown)."""
        if self.interval is None:
            return ""
        low, high = self.interval
        text = f"; 95% Wilson interval [{low:.3f}, {high:.3f}]"
        if self.decided:
            return f"{text} lies on one side of it: the probe decided"
        needed = groups_to_decide(self.figure, self.threshold)
        more = f"about {needed} groups would decide at this figure" if needed else "no probe size decides at this figure"
        return f"{text} holds the threshold: a probe this size cannot tell, and another seed or CPU may differ ({more})"

    def summary(self) -> dict[str, object]:
        """The figures a reader of the check or of the checkpoint it licensed needs."""
        return {
            "zero_variance_fraction": self.figure,
            "group_size": self.group_size,
            "groups": self.groups,
            "steps": self.steps,
            "threshold": self.threshold,
            "probe_run_id": self.probe_run_id,
            "gate_on": self.gate_on,
            "flat_reward_fraction": self.reward_figure,
            "same_correctness_fraction": self.correctness_figure,
            "interval": list(self.interval) if self.interval is not None else None,
            "decided": self.decided,
        }


def groups_to_decide(figure: float, threshold: float, *, most: int = 1_000_000) -> int | None:
    """The fewest groups at which a probe reading `figure` would have a 95% Wilson interval clear
    of `threshold` (None when none up to `most` would: the figure is the threshold)."""
    def clear(groups: int) -> bool:
        low, high = (float(end) for end in wilson_interval(figure * groups, groups))
        return high < threshold if figure < threshold else low >= threshold

    if not clear(most):
        return None
    fewest, enough = 1, most  # the interval narrows as groups grow, so bisect
    while fewest < enough:
        middle = (fewest + enough) // 2
        fewest, enough = (fewest, middle) if clear(middle) else (middle + 1, enough)
    return enough


def step_flat_fraction(row: Mapping[str, object]) -> float:
    """A step's share of groups without signal; a step that logged none counts as all flat.

    `frac_groups_no_signal` (ours) also counts groups left with < 2 scorable rollouts after
    infrastructure exclusions, which TRL's `frac_reward_zero_std` does not; prefer it.
    """
    for key in ("frac_groups_no_signal", "frac_zero_std"):
        value = row.get(key)
        if isinstance(value, int | float) and not math.isnan(float(value)):
            return float(value)
    return 1.0


def step_same_correctness(row: Mapping[str, object]) -> float | None:
    """A step's share of groups whose rollouts all had the same correctness; None when not logged."""
    value = row.get("frac_same_correctness")
    if isinstance(value, int | float) and not math.isnan(float(value)):
        return float(value)
    return None


def running_mean(values: Iterable[float | None]) -> list[float | None]:
    """The mean of the values so far at each position (None entries are skipped): the figure the
    gate would judge had the probe stopped there (steps hold equal numbers of groups)."""
    total, count, running = 0.0, 0, []
    for value in values:
        if value is not None and not math.isnan(value):
            total, count = total + value, count + 1
        running.append(total / count if count else None)
    return running


def evaluate_zero_variance(
    step_rows: Iterable[Mapping[str, object]],
    *,
    probe_run_id: str,
    group_size: int,
    groups_per_step: int,
    threshold: float = ZERO_VARIANCE_THRESHOLD,
    gate_on: GateOn = GATE_ON_REWARD,
) -> GateVerdict:
    """Pool the probe's steps (equal groups per step, so the mean of step fractions) and judge the
    figure `gate_on` names; both figures are reported. A step that did not log the correctness
    figure leaves it unmeasured (and a correctness gate then sees no evidence of a signal)."""
    rows = list(step_rows)
    flat_reward = [step_flat_fraction(row) for row in rows]
    measured = [step_same_correctness(row) for row in rows]
    same_correctness = [f for f in measured if f is not None]
    reward_figure = sum(flat_reward) / len(flat_reward) if flat_reward else 1.0
    correctness_figure = (
        sum(same_correctness) / len(same_correctness) if same_correctness and len(same_correctness) == len(rows) else None
    )
    judged = flat_reward if gate_on == GATE_ON_REWARD else same_correctness
    figure = reward_figure if gate_on == GATE_ON_REWARD else correctness_figure
    if not rows:
        detail = "the probe logged no steps: no evidence of a gradient"
    elif figure is None:
        detail = "the probe did not log the same-correctness figure at every step: no evidence of a routing signal"
    else:
        detail = f"per-step fractions ({gate_on}): {[round(f, 3) for f in judged]}"
    figure = 1.0 if figure is None else figure
    groups = len(rows) * groups_per_step
    interval = tuple(float(end) for end in wilson_interval(round(figure * groups), groups)) if groups else None
    return GateVerdict(
        gate=ZERO_VARIANCE_GATE,
        probe_run_id=probe_run_id,
        passed=figure < threshold,  # strictly below: a tie fails
        figure=figure,
        threshold=threshold,
        group_size=group_size,
        steps=len(rows),
        groups=groups,
        evaluated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        detail=detail,
        gate_on=gate_on,
        reward_figure=reward_figure,
        correctness_figure=correctness_figure,
        interval=interval,
    )


def judge_probe(
    manifest: Mapping[str, Any],
    logged_steps: Iterable[Mapping[str, object]],
    threshold: float = ZERO_VARIANCE_THRESHOLD,
    gate_on: GateOn = GATE_ON_REWARD,
) -> GateVerdict:
    """The gate over a probe run: its logged `training_steps` rows (TRL's flat-group figure, and
    ours when logged) with the probe manifest's per-step figures where a row lacks them."""
    by_step = {s["step"]: s for s in manifest["steps"]}
    rows = []
    for logged in logged_steps:
        recorded = by_step.get(logged["step"], {})
        rows.append({
            "frac_zero_std": logged["frac_zero_std"],
            **{key: _first_present(logged.get(key), recorded.get(key)) for key in _OUR_STEP_FIGURES},
        })
    return evaluate_zero_variance(
        rows, probe_run_id=manifest["probe_run_id"], group_size=manifest["group_size"],
        groups_per_step=manifest["groups_per_step"], threshold=threshold, gate_on=gate_on,
    )


# Per-step figures the reward logs (and `training_steps` and the probe manifest keep).
_OUR_STEP_FIGURES = ("frac_groups_no_signal", "frac_same_correctness")


def _first_present(*values: object) -> object:
    return next((v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))), None)


def write_verdict(path: str | Path, verdict: GateVerdict) -> None:
    """Write atomically: a half-written verdict must never read as a pass."""
    write_json_atomic(path, asdict(verdict))


def read_verdict(path: str | Path) -> GateVerdict | None:
    path = Path(path)
    if not path.is_file():
        return None
    fields = read_json_checked(path, "gate verdict")
    if fields.get("interval") is not None:
        fields["interval"] = tuple(fields["interval"])  # JSON keeps it as a list
    return GateVerdict(**fields)


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
        {"step": s["step"], "frac_zero_std": s["frac_zero_std"], **{key: s[key] for key in _OUR_STEP_FIGURES if key in s}}
        for s in step_rows
    ]
    return {"probe_run_id": probe_run_id, **facts, "group_size": group_size, "groups_per_step": groups_per_step,
            "steps": steps}


def write_probe_manifest(probe_dir: str | Path, manifest: Mapping[str, Any], name: str = PROBE_MANIFEST) -> Path:
    """Record the latest probe run (the gate and training read it to know which probe is current),
    or, with `name=RUN_MANIFEST` in a probe run's own folder, that the run finished."""
    path = Path(probe_dir) / name
    write_json_atomic(path, manifest)
    return path


def read_probe_manifest(probe_dir: str | Path, name: str = PROBE_MANIFEST) -> dict | None:
    """The latest probe run's manifest (or a probe run's own, `name=RUN_MANIFEST`); None when there is none."""
    path = Path(probe_dir) / name
    return read_json_checked(path, "probe manifest") if path.is_file() else None


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
