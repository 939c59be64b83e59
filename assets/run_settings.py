"""Settings of a headless run from a file: `python -m assets.main --config FILE`.

The file is YAML in the shape of Dagster run config, restricted to what decides results:

    resources:            # fields of the project's resources, as their classes name them
      trainer: {probe_steps: 4, max_steps: 6}
    ops:                  # each asset's config, as the launchpad shows it
      eval_arms: {slice_size: 48}

Resource settings are applied when the definitions are built and op settings are part of each
asset's code version (`assets/versions.py`), so staleness stays honest: a materialization made with
one file is stale for a run with another, and for a run without one. This is the seam a profile
that is not the default (a cheaper test configuration, a long training run) plugs into.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from conductor_pipeline.files import parse_yaml

# The resources a settings file may configure (the pool comes from --pool; vLLM is launch-time config).
CONFIGURABLE_RESOURCES = ("warehouse", "conductor", "trainer")
# What a settings file may set that changes how the eval runs and never what is trained.
EVALUATION_OPS = ("eval_arms", "eval_tables")
EVALUATION_RESOURCES = ("conductor",)
# Trainer fields that tell seed runs of one recipe apart rather than make another recipe.
SEED_FIELDS = ("seed",)


class RunSettingsError(ValueError):
    """A settings file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class RunSettings:
    """Resource fields per resource key and config per op, from a settings file (empty: the defaults)."""

    resources: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    ops: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: str = "defaults"

    def resource(self, key: str) -> dict[str, Any]:
        return dict(self.resources.get(key, {}))

    def with_resource(self, key: str, **fields: Any) -> RunSettings:
        """These settings with `fields` of resource `key` set (e.g. the trainer's seed of one seed run)."""
        return replace(self, resources={**self.resources, key: {**self.resource(key), **fields}})

    def recipe(self, profile: str) -> str:
        """What a run trains, by name: the trainer profile, and the settings file's name when there is
        one (`cpu`, `cpu-paper+replay-mixed6-vote-fan-outs`). Seed runs of one recipe share it."""
        return profile if self.source == "defaults" else f"{profile}+{Path(self.source).stem}"

    def trained_recipe(self, profile: str) -> str:
        """The recipe of what the run trains: `recipe`, or the profile alone when the file sets only
        the evaluation's settings (a larger eval slice evaluates the profile's own checkpoint)."""
        trains = any(op not in EVALUATION_OPS for op in self.ops) or any(
            key not in EVALUATION_RESOURCES and set(fields) - set(SEED_FIELDS)
            for key, fields in self.resources.items()
        )
        return self.recipe(profile) if trains else profile

    def run_config(self, ops: list[str]) -> dict[str, Any]:
        """The `ops` part of the run config of a run that materializes `ops`."""
        return {"ops": {name: {"config": dict(self.ops[name])} for name in ops if name in self.ops}}


def load_run_settings(path: str | Path) -> RunSettings:
    """Read and check a settings file; unknown keys are refused, naming the file and the key."""
    path = Path(path)
    try:
        raw = parse_yaml(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise RunSettingsError(f"cannot read run settings {path}: {exc}") from exc
    if not isinstance(raw, dict) or set(raw) - {"resources", "ops"}:
        raise RunSettingsError(f"{path}: the top level may hold only `resources` and `ops`, found {sorted(raw)}")
    resources, ops = raw.get("resources") or {}, raw.get("ops") or {}
    unknown = sorted(set(resources) - set(CONFIGURABLE_RESOURCES))
    if unknown:
        raise RunSettingsError(f"{path}: resources {unknown} cannot be configured here; known: {CONFIGURABLE_RESOURCES}")
    for section, entries in (("resources", resources), ("ops", ops)):
        bad = [key for key, value in entries.items() if not isinstance(value, dict)]
        if bad:
            raise RunSettingsError(f"{path}: {section}.{bad[0]} must be a mapping of settings")
    return RunSettings(resources=resources, ops=ops, source=str(path))
