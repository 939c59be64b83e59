"""The IO manager of outputs one asset hands another: JSON files, never pickles.

Dagster's `FilesystemIOManager` pickles outputs, and unpickling a file runs whatever code it
carries: anyone who can write the storage folder could run code in the next step. An output here
is a value whose type has `to_json_dict()` and a `from_json_dict()` classmethod; it is written
atomically under the artifacts root (`<artifacts root>/outputs/<asset key>.json`, a volume every
pod mounts on a cluster) and read back through the type the input is annotated with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from conductor_pipeline.files import read_json_checked, write_json_atomic
from conductor_pipeline.paths import artifacts_root


def default_outputs_dir() -> str:
    return str(artifacts_root() / "outputs")


class JsonIOManager(dg.ConfigurableIOManager):
    """Outputs as JSON under `base_dir`; types without a JSON form are refused, not pickled."""

    base_dir: str = Field(default_factory=default_outputs_dir, description="Folder of the outputs' JSON files")

    def _path(self, key: dg.AssetKey) -> Path:
        return Path(self.base_dir).joinpath(*key.path).with_suffix(".json")

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        if not callable(getattr(obj, "to_json_dict", None)):
            raise TypeError(
                f"output of {context.asset_key.to_user_string()} is a {type(obj).__name__}, which has no JSON form "
                "(to_json_dict/from_json_dict); outputs are never pickled"
            )
        payload = {"type": f"{type(obj).__module__}.{type(obj).__qualname__}", "value": obj.to_json_dict()}
        json.dumps(payload)  # refuse a value that is not plain JSON before anything is written
        write_json_atomic(self._path(context.asset_key), payload, "asset output")

    def load_input(self, context: dg.InputContext) -> Any:
        kind = context.dagster_type.typing_type
        path = self._path(context.asset_key)
        if not path.is_file():
            raise FileNotFoundError(
                f"no stored output of {context.asset_key.to_user_string()} at {path}: materialize it again"
            )
        payload = read_json_checked(path, "asset output")
        expected = f"{kind.__module__}.{kind.__qualname__}"
        if payload.get("type") != expected:
            raise TypeError(f"{path} holds a {payload.get('type')}, not the {expected} this input reads")
        return kind.from_json_dict(payload["value"])
