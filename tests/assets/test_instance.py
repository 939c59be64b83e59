"""The headless entry points open this project's Dagster instance, with or without DAGSTER_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from assets import instance as project_instance


def test_without_dagster_home_the_entry_points_use_the_projects_instance_as_make_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "project" / ".dagster_home"
    monkeypatch.setattr(project_instance, "PROJECT_DAGSTER_HOME", home)
    monkeypatch.setenv("DAGSTER_HOME", "set before, so that the test's own setting is undone after it")
    monkeypatch.delenv("DAGSTER_HOME")
    said: list[str] = []
    with project_instance.open_instance(said.append) as instance:
        assert Path(instance.root_directory) == home
        assert (home / "dagster.yaml").read_text() == project_instance.INSTANCE_SETTINGS.read_text()
    assert said == [f"DAGSTER_HOME is not set: using {home}, as make does"]
    assert os.environ["DAGSTER_HOME"] == str(home)  # the runs' processes open the same one


def test_a_set_dagster_home_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(project_instance, "PROJECT_DAGSTER_HOME", tmp_path / "never")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    said: list[str] = []
    with project_instance.open_instance(said.append) as instance:
        assert Path(instance.root_directory) == tmp_path / "home" and instance.get_runs() == []
    assert said == [] and not (tmp_path / "never").exists()
