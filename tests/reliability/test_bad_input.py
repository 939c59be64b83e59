"""Malformed inputs get a clear error that names the file and the field, line or worker.

Corpus lines, pool files (YAML errors, wrong types, unknown fields, unknown backends), a missing
API-key variable and data files with the wrong checksum, each through the public entry point a
user would hit first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from conductor_pipeline.corpora.loaders import CorpusFormatError, load_gsm8k, read_gsm8k, read_math500, read_math_full
from conductor_pipeline.corpora.sources import CACHE_DIR_ENV, DATA_DIR_ENV, DataIntegrityError, load_registry
from conductor_pipeline.pools.backends.registry import build_workers
from conductor_pipeline.pools.config import MissingApiKeyError, PoolConfigError, check_api_keys, load_pool
from resources.pool import PoolResource

GOOD_MATH500 = {"unique_id": "test/algebra/1.json", "problem": "1+1?", "answer": "2", "subject": "Algebra", "level": 1}
GOOD_GSM8K = {"question": "How many?", "answer": "Two and two.\n#### 4"}


def jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# --- corpora -------------------------------------------------------------------------------------

MATH500_CASES = {
    # name: (line 2 of the file, words the error must contain)
    "bad JSON": ('{"unique_id": "test/x/2.json", "problem": ', ["line 2", "bad JSON"]),
    "not an object": ("[1, 2, 3]", ["line 2", "JSON object", "list"]),
    "missing field": (json.dumps({k: v for k, v in GOOD_MATH500.items() if k != "problem"}), ["line 2", "'problem'"]),
    "wrong type": (json.dumps({**GOOD_MATH500, "level": "5"}), ["line 2", "'level'", "int", "str"]),
    "bool is not an int": (json.dumps({**GOOD_MATH500, "level": True}), ["line 2", "'level'"]),
    "empty line": ("", ["line 2", "empty line"]),
    "bad split in id": (json.dumps({**GOOD_MATH500, "unique_id": "dev/x/1.json"}), ["line 2", "unique_id", "dev/x/1.json"]),
}


@pytest.mark.parametrize("case", list(MATH500_CASES))
def test_malformed_math500_lines_name_file_line_and_field(case: str, tmp_path: Path) -> None:
    bad_line, words = MATH500_CASES[case]
    path = jsonl(tmp_path / "math500.jsonl", [json.dumps(GOOD_MATH500), bad_line, json.dumps(GOOD_MATH500)])
    with pytest.raises(CorpusFormatError) as caught:
        read_math500(path)
    message = str(caught.value)
    assert str(path) in message and caught.value.path == str(path)
    for word in words:
        assert word in message, (word, message)


def test_malformed_gsm8k_lines_name_file_line_and_field(tmp_path: Path) -> None:
    no_marker = jsonl(tmp_path / "a.jsonl", [json.dumps(GOOD_GSM8K), json.dumps({**GOOD_GSM8K, "answer": "four"})])
    with pytest.raises(CorpusFormatError, match=re.escape(f"{no_marker}, line 2: field 'answer'")):
        read_gsm8k(no_marker, "test")
    wrong_type = jsonl(tmp_path / "b.jsonl", [json.dumps({**GOOD_GSM8K, "question": 7})])
    with pytest.raises(CorpusFormatError, match=re.escape(f"{wrong_type}, line 1: field 'question' must be str")):
        read_gsm8k(wrong_type, "test")
    with pytest.raises(ValueError, match="split must be one of"):
        read_gsm8k(wrong_type, "validation")


def test_math_parquet_with_a_wrong_column_type_names_the_column(tmp_path: Path) -> None:
    path = tmp_path / "math.parquet"
    pl.DataFrame({
        "unique_id": ["test/algebra/1.json"], "split": ["test"], "type": ["Algebra"], "problem": ["1+1?"],
        "level": [5], "answer_last_boxed": ["2"], "in_math500": [False],
    }).write_parquet(path)
    with pytest.raises(CorpusFormatError) as caught:
        read_math_full(path)
    assert str(path) in str(caught.value) and "'level'" in str(caught.value) and "schema" in str(caught.value)


# --- pool files ----------------------------------------------------------------------------------

SEAT = "  - name: q4\n    backend: openai\n    model: m\n    description: a seat\n    endpoint: http://127.0.0.1:9/v1\n"
POOL_CASES = {
    # name: (file text, words the error must contain)
    "YAML syntax": ("name: p\nworkers: [\n  - name: a\n", ["not valid YAML", "line 3"]),
    "top level is a list": ("- name: p\n", ["expected a mapping", "list"]),
    "wrong type": ("name: p\nworkers:\n" + SEAT + "    concurrency: lots\n", ["workers[0] (worker 'q4').concurrency", "integer"]),
    "unknown field": ("name: p\nworkers:\n" + SEAT + "    colour: red\n", ["workers[0] (worker 'q4').colour", "Extra inputs"]),
    "unknown backend": (
        "name: p\nworkers:\n" + SEAT.replace("openai", "anthropic-direct"),
        ["workers[0] (worker 'q4').backend", "'openai', 'vllm', 'replay', 'conductor' or 'vote'"],
    ),
    "openai seat without endpoint": (
        "name: p\nworkers:\n  - name: q9\n    backend: openai\n    model: m\n    description: d\n",
        ["workers[0] (worker 'q9')", "endpoint"],
    ),
    "a key in the file instead of a variable name": (
        "name: p\nworkers:\n" + SEAT + "    api_key_env: sk-live-123\n", ["workers[0] (worker 'q4').api_key_env"],
    ),
    "no workers": ("name: p\nworkers: []\n", ["workers", "at least 1"]),
    "duplicate worker names": ("name: p\nworkers:\n" + SEAT + SEAT, ["unique", "q4"]),
    "unknown governor field": ("name: p\ngovernor:\n  max_inflight: 3\nworkers:\n" + SEAT, ["governor.max_inflight"]),
}


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_malformed_pool_files_name_file_and_field(case: str, tmp_path: Path) -> None:
    text, words = POOL_CASES[case]
    path = tmp_path / "broken-pool.yaml"
    path.write_text(text)
    with pytest.raises(PoolConfigError) as caught:
        load_pool(path)
    message = str(caught.value)
    assert str(path) in message
    for word in words:
        assert word in message, (word, message)


def test_missing_pool_file_lists_the_shipped_pools(tmp_path: Path) -> None:
    with pytest.raises(PoolConfigError, match=r"no such pool file.*replay-mixed6"):
        load_pool(tmp_path / "nope.yaml")


def test_a_backend_the_factory_cannot_build_names_pool_and_worker(tmp_path: Path) -> None:
    path = tmp_path / "recursive.yaml"
    path.write_text("name: rec\nworkers:\n" + SEAT + "  - name: self\n    backend: conductor\n    model: c\n"
                    "    description: the conductor itself\n")
    with pytest.raises(NotImplementedError, match="pool 'rec', worker 'self'"):
        build_workers(load_pool(path))


# --- API keys ------------------------------------------------------------------------------------


def test_missing_api_key_variable_fails_before_any_call_naming_worker_and_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "hosted.yaml"
    # Port 9 (discard) on 127.0.0.1: nothing listens, so any attempted call would surface as a connect error.
    path.write_text("name: hosted\nworkers:\n" + SEAT + "    api_key_env: CORYPHAEUS_TEST_UNSET_KEY\n")
    monkeypatch.delenv("CORYPHAEUS_TEST_UNSET_KEY", raising=False)
    pool = load_pool(path)
    with pytest.raises(MissingApiKeyError) as caught:
        check_api_keys(pool)
    assert "worker 'q4'" in str(caught.value) and "CORYPHAEUS_TEST_UNSET_KEY" in str(caught.value)
    assert "pool 'hosted'" in str(caught.value)
    # The Dagster resource's path: workers are never built, so no call can be made.
    with pytest.raises(MissingApiKeyError, match="worker 'q4' needs environment variable CORYPHAEUS_TEST_UNSET_KEY"):
        PoolResource(pool=str(path)).build_workers()
    # An empty value counts as missing (a blank export is a mistake, not a key).
    monkeypatch.setenv("CORYPHAEUS_TEST_UNSET_KEY", "")
    with pytest.raises(MissingApiKeyError):
        check_api_keys(pool)


# --- checksums -----------------------------------------------------------------------------------


def corrupt_mirror(tmp_path: Path, key: str, content: bytes) -> tuple[Path, Path]:
    """A data mirror holding a file with the registered path of `key` but other bytes."""
    mirror = tmp_path / "mirror"
    target = mirror / load_registry()[key].path
    target.parent.mkdir(parents=True)
    target.write_bytes(content)
    return mirror, target


def test_replay_pool_with_a_wrong_checksum_is_refused_naming_file_and_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror, target = corrupt_mirror(tmp_path, "zeroeval_outputs", b"PAR1 not the recorded outputs PAR1")
    monkeypatch.setenv(DATA_DIR_ENV, str(mirror))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    with pytest.raises(DataIntegrityError) as caught:
        build_workers(load_pool("replay-mixed6"))
    message = str(caught.value)
    assert str(target) in message and "entry 'zeroeval_outputs', field sha256" in message
    assert load_registry()["zeroeval_outputs"].sha256 in message
    assert caught.value.key == "zeroeval_outputs"


def test_corpus_with_a_wrong_checksum_is_refused_before_parsing(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "gsm8k_test.jsonl", [json.dumps(GOOD_GSM8K)])  # well-formed, but not GSM8K's bytes
    with pytest.raises(DataIntegrityError) as caught:
        load_gsm8k("test", path=path)
    assert str(path) in str(caught.value) and "entry 'gsm8k_test', field sha256" in str(caught.value)
