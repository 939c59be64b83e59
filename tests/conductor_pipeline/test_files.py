"""`parse_yaml`, the project's one YAML reader: libyaml's speed, `yaml.safe_load`'s documents and
errors. (The atomic writes and checked reads: tests/reliability/test_damaged_files.py and
test_full_disk.py.)"""

from __future__ import annotations

import pytest
import yaml

from conductor_pipeline.files import parse_yaml
from conductor_pipeline.paths import PROJECT_ROOT

SHIPPED_YAML = sorted(
    path for pattern in ("data/**/*.yaml", "docs/**/*.yaml", "deploy/**/*.yaml", "tests/**/*.yaml")
    for path in PROJECT_ROOT.glob(pattern)
)


def test_every_shipped_yaml_file_reads_as_safe_load_reads_it() -> None:
    """The same values; and where safe_load refuses a file (a multi-document Kubernetes manifest),
    the same refusal."""
    assert len(SHIPPED_YAML) > 20
    for path in SHIPPED_YAML:
        text = path.read_text()
        try:
            expected = yaml.safe_load(text)
        except yaml.YAMLError as refusal:
            with pytest.raises(type(refusal)):
                parse_yaml(text)
            continue
        assert parse_yaml(text) == expected, path


def test_a_malformed_document_is_refused_quoting_the_offending_line() -> None:
    with pytest.raises(yaml.YAMLError) as raised:
        parse_yaml("name: pool\nworkers: [a, b\nbackend: replay\n")
    assert "line 3, column 8" in str(raised.value) and "backend: replay" in str(raised.value)


def test_unsafe_tags_are_refused() -> None:
    with pytest.raises(yaml.YAMLError):
        parse_yaml("!!python/object/apply:os.system ['true']\n")
