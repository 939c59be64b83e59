"""Code and data versions: what Dagster compares to tell a fresh asset from a stale one.

An asset's code version is a hash of everything that decides its result other than its upstream
assets' data:

- the project source files its module imports, transitively (`assets`, `resources`,
  `conductor_pipeline`; imports inside functions count too),
- the SQL files (`sql/<name>.sql`) and data files (`data/<name>`) those sources name in a string,
- the settings of the resources it uses, as the definitions were built, and the pool file's
  contents for the pool resource.

Its config class is in its module, so a changed default changes the version. A change to any of
these makes the asset stale in the UI and for `python -m assets.main`, which recomputes it and
then everything whose input data version changes with it; nothing else changes it, so a rerun with
nothing changed recomputes nothing. Run config typed in at launch (the UI's launchpad) is not
part of it: a materialization made with other run config stays fresh until something above changes.

Assets that return no data version get Dagster's logical one (a hash of the code version and the
inputs' data versions); those whose inputs live outside the graph return a fingerprint of them:
the corpora their files' sha256, `probe_calls` the pool's probe rows (`probe_calls_data_version`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

import dagster as dg
from pydantic import BaseModel

from conductor_pipeline.paths import DATA_DIR, PROJECT_ROOT, SQL_DIR
from conductor_pipeline.pools.config import pool_path
from conductor_pipeline.warehouse import Warehouse
from resources.pool import PoolResource

PROJECT_PACKAGES = ("assets", "conductor_pipeline", "resources")
# Characters of a sha256 kept in a version: plenty to tell versions apart, short enough to read in the UI.
VERSION_CHARS = 16


def module_path(module: str) -> Path | None:
    """The source file of a project module (`a.b` -> a/b.py or a/b/__init__.py), None elsewhere."""
    if module.split(".")[0] not in PROJECT_PACKAGES:
        return None
    base = PROJECT_ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


# An import statement at the start of a line: `import a.b, c` or `from .a import (b, c)`. A regular
# expression, not a parse: it reads the sources of a whole import graph in milliseconds, and an
# import-like line in a docstring only adds a file to the hash.
_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+(?P<dots>\.*)(?P<base>[\w.]*)[ \t]+import[ \t]+(?P<names>\([^)]*\)|[^\n#;]*)"
    r"|import[ \t]+(?P<modules>[^\n#;]*))",
    re.MULTILINE,
)


@cache
def _source(path: Path) -> str:
    return path.read_text()


def _imported_modules(module: str, path: Path) -> set[str]:
    """Project modules `module` imports anywhere in its source, with the packages that import runs."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for match in _IMPORT.finditer(_source(path)):
        if match["modules"] is not None:
            names = [part.split()[0] for part in match["modules"].split(",") if part.strip()]
        else:
            base = match["base"]
            if level := len(match["dots"]):
                anchor = package.split(".")[: len(package.split(".")) - level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            aliases = [part.split()[0] for part in match["names"].strip("()").split(",") if part.strip()]
            # `from a.b import c` imports module a.b.c when there is one, else names of a.b.
            names = [f"{base}.{alias}" if module_path(f"{base}.{alias}") else base for alias in aliases]
        for name in names:
            parts = name.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {name for name in found if module_path(name) is not None}


@cache
def source_closure(module: str) -> tuple[Path, ...]:
    """Every project source file that importing `module` runs, sorted."""
    seen: dict[str, Path] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        path = module_path(name)
        if name in seen or path is None:
            continue
        seen[name] = path
        pending.extend(_imported_modules(name, path) - seen.keys())
    return tuple(sorted(set(seen.values())))


@cache  # like `_source`, per process: every definition build asks again for the same closures
def named_files(sources: tuple[Path, ...]) -> tuple[Path, ...]:
    """The SQL and data files the sources name in a quoted string (`"pass_rates"` ->
    sql/pass_rates.sql; `"sources.yaml"` -> data/sources.yaml)."""
    candidates = {path.stem: path for path in SQL_DIR.glob("*.sql")} | {
        path.name: path for path in DATA_DIR.iterdir() if path.is_file()
    }
    texts = [_source(path) for path in sources]
    return tuple(sorted(
        path for name, path in candidates.items()
        if any(f'"{name}"' in text or f"'{name}'" in text for text in texts)
    ))


def settings_of(value: object) -> object:
    """A resource's settings as plain JSON values (a nested resource by its own settings; a resource
    configured at launch, which has none yet, by its class)."""
    if isinstance(value, BaseModel):
        return {name: settings_of(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, Mapping):
        return {str(k): settings_of(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [settings_of(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return type(value).__qualname__


def resource_fingerprint(resource: object) -> str:
    """What of a resource decides results: its settings, and for the pool resource the pool file."""
    text = json.dumps(settings_of(resource), sort_keys=True)
    if isinstance(resource, PoolResource):
        path = pool_path(resource.pool)
        text += "\n" + (hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else f"missing:{path}")
    return text


def _digest(parts: Iterable[str | bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:VERSION_CHARS]


@cache
def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def asset_module(assets_def: dg.AssetsDefinition) -> str:
    """The module that defines an asset's compute function."""
    return assets_def.op.compute_fn.decorated_fn.__module__


def code_version(module: str, resources: Mapping[str, object], config: Mapping | None = None) -> str:
    """The code version of an asset defined in `module` that uses `resources` (key -> resource),
    run with op `config` (a `--config` file's, `assets/run_settings.py`; None: the defaults)."""
    sources = source_closure(module)
    files = [*sources, *named_files(sources)]
    return _digest([
        *(f"{path.relative_to(PROJECT_ROOT)}:{_file_digest(path)}" for path in files),
        *(f"resource {key}: {resource_fingerprint(resources[key])}" for key in sorted(resources)),
        *([f"config: {json.dumps(config, sort_keys=True)}"] if config else []),
    ])


def with_code_versions(
    assets: Iterable[dg.AssetsDefinition], resources: Mapping[str, object], op_config: Mapping[str, Mapping] | None = None
) -> list[dg.AssetsDefinition]:
    """Each asset with its code version (`code_version`) from its module, the resources it uses and
    the op config it runs with (`op_config`: op name -> config)."""
    versioned = []
    for assets_def in assets:
        used = {key: resources[key] for key in assets_def.required_resource_keys if key in resources}
        version = code_version(asset_module(assets_def), used, (op_config or {}).get(assets_def.op.name))
        versioned.append(assets_def.map_asset_specs(lambda spec, v=version: spec.replace_attributes(code_version=v)))
    return versioned


def probe_calls_data_version(store: Warehouse, pool: str) -> dg.DataVersion:
    """The data version of `probe_calls`: the pool's probe rows, so a rerun that writes nothing keeps
    it (nothing downstream goes stale) and a new sample, a retried call or a regrade changes it."""
    row = store.query_file("probe_calls_fingerprint", {"pool": pool}).row(0, named=True)
    return dg.DataVersion(f"{row['calls']}-{row['digest'][:VERSION_CHARS]}")
