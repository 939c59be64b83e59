"""Artifact files that are whole or absent, and that say when they are not what was written.

A step can be killed at any byte (SIGKILL, an OOM killer, an evicted pod) and a disk can fill up
mid-write. Every artifact a later step reads is therefore written to a temporary file beside it,
flushed to disk and renamed over the target: a reader sees the old file or the whole new one.
A write that fails (a full disk above all) removes its temporary file and raises
`ArtifactWriteError`, which names the file and says what to do.

Folders of files written by other libraries (a checkpoint, a saved model) cannot be renamed into
place file by file; they get a manifest instead (`write_manifest`), written last, that lists each
file's size and sha256, so a reader can tell a complete folder from a half-written or damaged one
(`manifest_problem`).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # polars is imported where a table is written or read: training runs without it
    import polars as pl

import numpy as np
import yaml

# What a manifest calls itself, so a reader never mistakes another JSON file for one.
MANIFEST_FORMAT = "coryphaeus-file-manifest"
_HASH_CHUNK_BYTES = 1 << 20
# How the temporary file of an atomic write is named: hidden, beside the target, per process.
_TEMP_SUFFIX = ".tmp"


# libyaml's safe loader where PyYAML was built with it: the same documents, an order of magnitude
# faster than the pure-Python loader (a pool file is read at every step that names the pool).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str) -> Any:
    """A YAML document as plain values, as `yaml.safe_load` reads it. A malformed document raises
    the pure-Python loader's `yaml.YAMLError`, which quotes the offending line under its position."""
    try:
        return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader, never the full one
    except yaml.YAMLError:
        if _YAML_LOADER is yaml.SafeLoader:
            raise
        return yaml.safe_load(text)  # raises the same error, with the line quoted


class ArtifactWriteError(OSError):
    """An artifact could not be written; the file it names is unchanged (the old one, or none)."""


class DamagedArtifactError(ValueError):
    """An artifact on disk is not what its writer wrote (truncated, edited, half-written)."""


def is_disk_full(error: BaseException) -> bool:
    """Whether an error (or one it was raised from) is a full disk: ENOSPC, or a library's
    message carrying it (DuckDB, safetensors and polars report it as text)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(current)
        if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


KEPT_AS_IT_WAS = "the previous file, if any, is unchanged; nothing half-written is kept"


def write_failure(path: str | Path, what: str, error: BaseException, kept: str = KEPT_AS_IT_WAS) -> ArtifactWriteError:
    """The error to raise when writing `what` at `path` failed: it names the path, and on a full
    disk says so, what was kept (`kept`), and that a rerun after freeing space resumes."""
    if is_disk_full(error):
        return ArtifactWriteError(
            errno.ENOSPC, f"no space left on the device while writing {what} {path}: free space on that device and rerun ({kept})",
        )
    return ArtifactWriteError(getattr(error, "errno", None) or errno.EIO, f"could not write {what} {path}: {error}")


def temporary_sibling(path: Path) -> Path:
    """Where an atomic write of `path` stages its bytes: a hidden file beside it, one per process."""
    return path.with_name(f".{path.name}.{os.getpid()}{_TEMP_SUFFIX}")


def is_temporary(path: Path) -> bool:
    """Whether `path` is the staging file of an atomic write (left behind by a killed process)."""
    return path.name.startswith(".") and path.name.endswith(_TEMP_SUFFIX)


def _fsync_directory(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path, what: str = "artifact") -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the body returns, its file is flushed to disk and
    renamed over `path`. When the body raises, the temporary file is removed and `path` is left as
    it was; an OSError (a full disk) becomes an `ArtifactWriteError` naming `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = temporary_sibling(path)
    try:
        yield staging
        with staging.open("rb+") as handle:
            os.fsync(handle.fileno())
        staging.replace(path)
        _fsync_directory(path.parent)
    except BaseException as exc:
        staging.unlink(missing_ok=True)
        if isinstance(exc, ArtifactWriteError) or not (isinstance(exc, OSError) or is_disk_full(exc)):
            raise
        raise write_failure(path, what, exc) from exc


def write_bytes_atomic(path: str | Path, data: bytes, what: str = "artifact") -> Path:
    """Write `data` to `path` whole or not at all (see `atomic_path`)."""
    with atomic_path(path, what) as staging:
        staging.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | Path, text: str, what: str = "artifact") -> Path:
    """Write `text` (UTF-8) to `path` whole or not at all."""
    return write_bytes_atomic(path, text.encode(), what)


def write_json_atomic(path: str | Path, payload: Any, what: str = "JSON file") -> Path:
    """Write JSON whole or not at all: a half-written gate verdict must never read as a pass."""
    return write_text_atomic(path, json.dumps(payload, indent=1), what)


def write_parquet_atomic(frame: pl.DataFrame, path: str | Path, what: str = "table") -> Path:
    """Write a polars frame as Parquet whole or not at all."""
    with atomic_path(path, what) as staging:
        frame.write_parquet(staging)
    return Path(path)


def read_parquet_checked(path: str | Path, what: str = "table") -> pl.DataFrame:
    """Read a Parquet file, or raise `DamagedArtifactError` naming it when it is truncated or not
    Parquet (polars' own error names neither the file nor a way out)."""
    import polars as pl  # noqa: PLC0415 (see the import at the top)

    path = Path(path)
    try:
        return pl.read_parquet(path)
    except (pl.exceptions.ComputeError, OSError, ValueError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise DamagedArtifactError(f"{what} {path} is damaged or truncated ({exc})") from exc


def read_json_checked(path: str | Path, what: str = "JSON file") -> Any:
    """Parse a JSON artifact, or raise `DamagedArtifactError` naming it when it does not parse."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedArtifactError(f"{what} {path} is damaged or truncated ({exc}); rebuild it by rerunning the step that writes it") from exc


def encode_array(value: np.ndarray) -> dict[str, Any]:
    """A numpy array as JSON: dtype, shape and its little-endian bytes in base64 (bit for bit,
    NaN included; numpy's own .npy would do, but then one artifact is two files)."""
    value = np.ascontiguousarray(value)
    little = value.astype(value.dtype.newbyteorder("<"), copy=False)
    return {"dtype": value.dtype.str.lstrip("<>|="), "shape": list(value.shape),
            "data": base64.b64encode(little.tobytes()).decode()}


def decode_array(payload: dict[str, Any]) -> np.ndarray:
    """The array `encode_array` wrote, in native byte order."""
    dtype = np.dtype(payload["dtype"]).newbyteorder("<")
    raw = np.frombuffer(base64.b64decode(payload["data"]), dtype=dtype).reshape(payload["shape"])
    return raw.astype(dtype.newbyteorder("="), copy=True)


# --- manifests of folders ----------------------------------------------------------------------


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: str | Path, name: str, extra: dict[str, Any] | None = None) -> Path:
    """List every file of `folder` (but the manifest) with its size and sha256 in `folder/name`,
    written last and atomically: the folder is complete exactly when its manifest verifies."""
    folder = Path(folder)
    files = {
        str(path.relative_to(folder)): {"size": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != name and not is_temporary(path)
    }
    return write_json_atomic(folder / name, {"format": MANIFEST_FORMAT, "files": files, **(extra or {})}, "manifest")


def read_manifest(folder: str | Path, name: str) -> dict[str, Any] | None:
    """The folder's manifest, or None when there is none or it is not one (so the folder is not complete)."""
    path = Path(folder) / name
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT else None


def manifest_problem(folder: str | Path, name: str, *, check_hashes: bool = True) -> str | None:
    """Why `folder` is not the complete folder its manifest describes (no manifest, a file missing,
    of another size or other bytes), or None when it is."""
    folder = Path(folder)
    manifest = read_manifest(folder, name)
    if manifest is None:
        return f"{folder / name} is missing or unreadable (the folder was never completed)"
    for relative, expected in manifest["files"].items():
        path = folder / relative
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{path} has {size} bytes, its manifest says {expected['size']} (truncated or rewritten)"
        if check_hashes and file_sha256(path) != expected["sha256"]:
            return f"{path} does not match the sha256 in its manifest (damaged or edited)"
    return None
