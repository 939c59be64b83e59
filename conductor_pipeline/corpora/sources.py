"""Find the project's public data files by name, and refuse any whose bytes are not the registered ones.

Every data file the project reads is registered in `data/sources.yaml` with its canonical URL
and sha256. `resolve_data_file(key)` finds it, in this order:

1. an explicit path (a caller's override);
2. a local mirror directory: `$CORYPHAEUS_DATA_DIR`, else `<project>/../shared/data` when it exists;
3. a download from the canonical URL into a cache (`$CORYPHAEUS_CACHE_DIR`), with pooch.

Whatever the source, the file's sha256 must match the registry: a different file with the
same name would silently change every number downstream. Hashes are memoised per
(path, size, mtime), so resolving the 16 MB telemetry parquet again costs a `stat`.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pooch
from pydantic import BaseModel, ConfigDict, Field

from conductor_pipeline.files import parse_yaml
from conductor_pipeline.paths import DATA_DIR, PROJECT_ROOT

SOURCES_FILE = DATA_DIR / "sources.yaml"
DATA_DIR_ENV = "CORYPHAEUS_DATA_DIR"
CACHE_DIR_ENV = "CORYPHAEUS_CACHE_DIR"
# The read-only mirror this project's machines share; used only when it exists.
DEFAULT_MIRROR_DIR = PROJECT_ROOT.parent / "shared" / "data"
# Downloads go to the user's cache, not the project: they outlive a checkout and are shared by clones.
DEFAULT_CACHE_DIR = Path(pooch.os_cache("coryphaeus"))
_HASH_CHUNK_BYTES = 1 << 20


class DataIntegrityError(ValueError):
    """A data file whose sha256 is not the registered one: refused, never used."""

    def __init__(self, file: str | Path, expected: str, actual: str | None, key: str | None = None) -> None:
        self.file = str(file)
        self.expected = expected
        self.actual = actual
        self.key = key
        registered = f"data/sources.yaml, entry {key!r}, field sha256" if key else "data/sources.yaml"
        super().__init__(
            f"refusing data file {self.file}: sha256 {actual or 'unknown'} does not match the "
            f"registered {expected} ({registered}). The file is corrupt, truncated or a "
            "different version; replace it with the registered one."
        )


class UnknownDataSourceError(KeyError):
    """A key that `data/sources.yaml` does not register."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class DataUnavailableError(FileNotFoundError):
    """The file is in no mirror and cannot be downloaded (a derived file)."""


class DataSource(BaseModel):
    """One registered file (an entry of data/sources.yaml)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(description="The name code resolves the file by")
    path: str = Field(description="Path relative to a mirror or cache directory")
    url: str = Field(description="Canonical public URL, pinned to a commit")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the file's bytes")
    size: int | None = Field(None, ge=0, description="Size in bytes, for people")
    derived: bool = Field(
        False, description="Built from `url` rather than served by it: never downloaded"
    )
    license: str | None = None
    note: str | None = None

    @property
    def downloadable(self) -> bool:
        return not self.derived


@cache
def load_registry(sources_file: Path = SOURCES_FILE) -> dict[str, DataSource]:
    """Every registered data source by key."""
    raw = parse_yaml(Path(sources_file).read_text())
    entries = raw.get("sources") if isinstance(raw, dict) else None
    if not isinstance(entries, dict):
        raise ValueError(f"{sources_file}: expected a top-level `sources:` mapping")
    return {key: DataSource(key=key, **fields) for key, fields in entries.items()}


def data_source(key: str) -> DataSource:
    """The registry entry for `key`, or an error that lists the known keys."""
    registry = load_registry()
    if key not in registry:
        raise UnknownDataSourceError(
            f"unknown data source {key!r}; registered in {SOURCES_FILE}: {', '.join(sorted(registry))}"
        )
    return registry[key]


def mirror_dir() -> Path | None:
    """The local mirror: `$CORYPHAEUS_DATA_DIR`, else ../shared/data when present, else None."""
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return DEFAULT_MIRROR_DIR if DEFAULT_MIRROR_DIR.is_dir() else None


def cache_dir() -> Path:
    """Where downloads land: `$CORYPHAEUS_CACHE_DIR`, else the user's cache directory."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_CACHE_DIR


_digest_memo: dict[tuple[str, int, int], str] = {}
_digest_memo_lock = threading.Lock()


def sha256_of(path: str | Path) -> str:
    """The file's sha256, memoised per (resolved path, size, mtime) so re-resolving is a `stat`."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    memo_key = (str(resolved), stat.st_size, stat.st_mtime_ns)
    with _digest_memo_lock:
        known = _digest_memo.get(memo_key)
    if known is not None:
        return known
    digest = hashlib.sha256()
    with resolved.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    hexdigest = digest.hexdigest()
    with _digest_memo_lock:
        _digest_memo[memo_key] = hexdigest
    return hexdigest


def verify_file(path: str | Path, source: DataSource) -> Path:
    """`path` if its sha256 is the registered one; DataIntegrityError otherwise."""
    actual = sha256_of(path)
    if actual != source.sha256:
        raise DataIntegrityError(path, source.sha256, actual, source.key)
    return Path(path)


def resolve_data_file(key: str, *, path: str | Path | None = None) -> Path:
    """The verified local path of registered data file `key` (explicit path, mirror, download)."""
    return resolve_source(data_source(key), path=path)


@dataclass(frozen=True, slots=True)
class VerifiedDataFile:
    """Where a registered file was found, its sha256 (checked against the registry) and its source."""

    path: Path
    sha256: str
    source_url: str


def verified_data_file(key: str) -> VerifiedDataFile:
    """Resolve registered file `key` (hash checked) and say where it came from, for provenance."""
    path = resolve_data_file(key)
    return VerifiedDataFile(path=path, sha256=sha256_of(path), source_url=data_source(key).url)


def resolve_source(source: DataSource, *, path: str | Path | None = None) -> Path:
    """`resolve_data_file` for a `DataSource` object (one not necessarily in the registry)."""
    key = source.key
    if path is not None:
        explicit = Path(path).expanduser()
        if not explicit.is_file():
            raise FileNotFoundError(f"data file for {key!r} not found at the given path {explicit}")
        return verify_file(explicit, source)

    mirror = mirror_dir()
    if mirror is not None and (mirror / source.path).is_file():
        return verify_file(mirror / source.path, source)

    if not source.downloadable:
        raise DataUnavailableError(
            f"data file {key!r} ({source.path}) is derived, so it cannot be downloaded, and it is "
            f"not in the mirror {mirror or '(none)'}: set ${DATA_DIR_ENV} to a copy of the shared "
            f"data folder or pass an explicit path. It was built from {source.url}."
        )
    try:
        return _download(source, cache_dir())
    except OSError as exc:  # requests' errors are OSErrors (offline, refused, HTTP 404); a bad hash is not
        raise DataUnavailableError(
            f"data file {key!r} ({source.path}) is not in the mirror {mirror or '(none)'} and downloading "
            f"it from {source.url} failed ({type(exc).__name__}: {exc}). Set ${DATA_DIR_ENV} to a copy of "
            f"the shared data folder, or pass an explicit path."
        ) from exc


_POOCH_MISMATCH = re.compile(r"but got ([0-9a-f]{64})")


def _download(source: DataSource, cache_root: Path) -> Path:
    """Fetch `source` into the cache with pooch, which checks the hash before keeping the file."""
    target = cache_root / source.path
    if target.is_file():
        try:
            return verify_file(target, source)
        except DataIntegrityError:
            target.unlink()  # a stale or corrupt cache entry: fetch it again
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fetched = pooch.retrieve(
            source.url,
            known_hash=f"sha256:{source.sha256}",
            fname=target.name,
            path=target.parent,
            progressbar=False,
        )
    except ValueError as exc:
        # pooch deletes a download whose hash differs and says so (with the hash) in a ValueError.
        if "hash" not in str(exc):
            raise
        mismatch = _POOCH_MISMATCH.search(str(exc))
        actual = mismatch.group(1) if mismatch else None
        raise DataIntegrityError(source.url, source.sha256, actual, source.key) from exc
    return verify_file(fetched, source)  # fills the memo; pooch has already checked the bytes
