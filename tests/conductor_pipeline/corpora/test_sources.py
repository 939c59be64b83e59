"""Data-file resolution: explicit path, mirror, hashed download, and refusal of altered bytes."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conductor_pipeline.corpora import sources
from conductor_pipeline.corpora.sources import (
    CACHE_DIR_ENV,
    DATA_DIR_ENV,
    DataIntegrityError,
    DataSource,
    DataUnavailableError,
    UnknownDataSourceError,
    load_registry,
    resolve_data_file,
    resolve_source,
    sha256_of,
)
from tests.shared_data import SHARED_DATA_DIR, require_shared_data

CONTRACT_KEYS = (
    "math500_test",
    "math_full",
    "gsm8k_test",
    "gsm8k_train",
    "gsm8k_test_socratic",
    "zeroeval_outputs",
    "routerdc_gsm8k_test",
)


@pytest.fixture
def empty_mirror(tmp_path, monkeypatch) -> Path:
    """A mirror with nothing in it and a fresh cache: resolution must download or fail."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    monkeypatch.setenv(DATA_DIR_ENV, str(mirror))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    return mirror


class _CountingHandler(SimpleHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).requests.append(self.path)
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def file_server(tmp_path) -> Iterator[tuple[str, Path, list[str]]]:
    """A real HTTP server on 127.0.0.1 serving a temp folder: (base URL, folder, request log)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = type("Handler", (_CountingHandler,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served, handler.requests
    finally:
        server.shutdown()
        server.server_close()


def test_registry_has_the_contract_keys_and_well_formed_entries():
    registry = load_registry()
    assert set(CONTRACT_KEYS) <= set(registry)
    assert registry["math_full"].derived and registry["zeroeval_outputs"].derived
    assert not registry["gsm8k_test"].derived
    for source in registry.values():
        if not source.derived:
            assert source.url.startswith("https://raw.githubusercontent.com/"), source.key
        assert source.note or not source.derived, f"{source.key}: a derived file needs a note"


def test_every_registered_file_in_the_mirror_matches_its_hash(tmp_path, monkeypatch):
    keys = tuple(load_registry())
    mirror = require_shared_data(monkeypatch, tmp_path / "cache", *keys)
    for key, source in load_registry().items():
        resolved = resolve_data_file(key)
        assert resolved == mirror / source.path
        assert resolved.stat().st_size == source.size, key
    assert not (tmp_path / "cache").exists(), "nothing may be downloaded when the mirror has it"


def test_default_mirror_is_shared_data_when_no_variable_is_set(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    expected = sources.DEFAULT_MIRROR_DIR if sources.DEFAULT_MIRROR_DIR.is_dir() else None
    assert sources.mirror_dir() == expected


def test_explicit_path_wins_over_the_mirror(tmp_path, monkeypatch):
    mirror = require_shared_data(monkeypatch, tmp_path / "cache", "gsm8k_test")
    copy = tmp_path / "elsewhere" / "gsm8k.jsonl"
    copy.parent.mkdir()
    shutil.copyfile(mirror / "corpora/gsm8k_test.jsonl", copy)
    assert resolve_data_file("gsm8k_test", path=copy) == copy
    with pytest.raises(FileNotFoundError, match="not found at the given path"):
        resolve_data_file("gsm8k_test", path=tmp_path / "nope.jsonl")


def test_tampered_mirror_copy_is_refused_with_both_hashes(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    original = SHARED_DATA_DIR / "corpora/math500_test.jsonl"
    tampered = mirror / "corpora/math500_test.jsonl"
    tampered.parent.mkdir(parents=True)
    data = bytearray(original.read_bytes())
    data[100] ^= 0x01  # one flipped bit, same size
    tampered.write_bytes(bytes(data))
    monkeypatch.setenv(DATA_DIR_ENV, str(mirror))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))

    expected = load_registry()["math500_test"].sha256
    actual = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(DataIntegrityError) as caught:
        resolve_data_file("math500_test")
    message = str(caught.value)
    assert str(tampered) in message and expected in message and actual in message
    assert (caught.value.expected, caught.value.actual) == (expected, actual)
    # The same bytes passed explicitly are refused too.
    with pytest.raises(DataIntegrityError):
        resolve_data_file("math500_test", path=tampered)


def test_hash_memo_notices_a_rewritten_file(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("first")
    first = sha256_of(target)
    assert sha256_of(target) == first
    target.write_text("other")  # same size; a new mtime invalidates the memo
    stat = target.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert sha256_of(target) == hashlib.sha256(b"other").hexdigest()


def test_unknown_key_lists_the_registered_ones():
    with pytest.raises(UnknownDataSourceError, match="gsm8k_test"):
        resolve_data_file("no_such_corpus")


def test_derived_file_missing_from_mirror_is_not_downloaded(empty_mirror):
    with pytest.raises(DataUnavailableError, match="derived"):
        resolve_data_file("math_full")


def _served_copy(key: str, base_url: str, served: Path) -> DataSource:
    """The registry entry for `key`, with its URL pointing at a local copy of the real bytes."""
    source = load_registry()[key]
    shutil.copyfile(SHARED_DATA_DIR / source.path, served / Path(source.path).name)
    return source.model_copy(update={"url": f"{base_url}/{Path(source.path).name}"})


def test_download_branch_fetches_verifies_and_then_reuses_the_cache(empty_mirror, tmp_path, file_server):
    base_url, served, requests = file_server
    source = _served_copy("gsm8k_test", base_url, served)

    fetched = resolve_source(source)
    assert fetched == tmp_path / "cache" / source.path
    assert sha256_of(fetched) == source.sha256
    assert len(requests) == 1

    assert resolve_source(source) == fetched
    assert len(requests) == 1, "a verified cache entry is reused without the network"

    fetched.write_bytes(b"corrupted")  # a damaged cache entry is fetched again
    assert sha256_of(resolve_source(source)) == source.sha256
    assert len(requests) == 2


def test_download_with_wrong_bytes_is_refused_and_not_kept(empty_mirror, tmp_path, file_server):
    base_url, served, _ = file_server
    source = _served_copy("gsm8k_test", base_url, served)
    (served / "gsm8k_test.jsonl").write_bytes(b"not the real file\n")

    with pytest.raises(DataIntegrityError) as caught:
        resolve_source(source)
    assert source.url in str(caught.value)
    assert caught.value.actual == hashlib.sha256(b"not the real file\n").hexdigest()
    assert not (tmp_path / "cache" / source.path).exists()


def test_failed_download_names_the_mirror_it_looked_in_and_the_url(empty_mirror, file_server):
    base_url, _, _ = file_server
    source = load_registry()["gsm8k_test"].model_copy(update={"url": f"{base_url}/missing.jsonl"})
    with pytest.raises(DataUnavailableError) as caught:
        resolve_source(source)
    message = str(caught.value)
    assert str(empty_mirror) in message and source.url in message and "404" in message
