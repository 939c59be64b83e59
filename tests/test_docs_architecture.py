"""docs/ARCHITECTURE.md describes the code as it is: every name it puts in backticks (a module, a
function, a class, a setting) and every path it names still exists, and the figures it states are
the code's own, so a rename, a move or a changed default fails here instead of leaving the page wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from assets.dead_runs import SLOT_WAIT_LOG_EVERY_S
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.warehouse import DEFAULT_REPLICA_INTERVAL_S, WAL_FOLD_BYTES
from conductor_pipeline.workflow import DEFAULT_MAX_STEPS

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
# The code the page describes: the product, and the test doubles it names (tests/fakes).
DESCRIBED_CODE = ("conductor_pipeline/**/*.py", "assets/**/*.py", "resources/**/*.py", "sql/*.sql", "benchmarks/*.py",
                  "scripts/*.py", "Makefile", "data/**/*.yaml", "deploy/**/*", "tests/fakes/*.py")
# Paths the page names that are made at run time or are examples, not files of the project.
RUNTIME_PATHS = {"warehouse.duckdb", "warehouse-replica.duckdb", "test/algebra/1143.json"}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
PATH = re.compile(r"[\w.-]+(/[\w.*-]*)+|[\w.-]+\.(py|sql|yaml|md|json|duckdb)")

# (what the page says, the code's value): the figures it states.
FIGURES = [
    ("checkpointing every 10 steps", GRPOSettings().save_steps == 10),
    ("At most 5 steps", DEFAULT_MAX_STEPS == 5),
    ("at most every 30 s, `replica_interval_s`", DEFAULT_REPLICA_INTERVAL_S == 30),
    ("until it holds 2 MiB", WAL_FOLD_BYTES == 2 * 1024 * 1024),
    ("says every 5 s who holds a slot", SLOT_WAIT_LOG_EVERY_S == 5),
]


def prose(text: str) -> str:
    """The page without its fenced blocks (the asset graph drawing)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def backticked(text: str) -> set[str]:
    return set(re.findall(r"`([^`\n]+)`", prose(text)))


def code_words() -> set[str]:
    """Every word of the described code, and the name of every module and package in it."""
    files = {path for pattern in DESCRIBED_CODE for path in ROOT.glob(pattern) if path.is_file()}
    modules = {path.stem for path in files if path.suffix == ".py"} | {path.parent.name for path in files}
    return modules | {word for path in files for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text(errors="ignore"))}


def path_exists(path: str) -> bool:
    path = path.rstrip("/")
    if "*" in path:
        return any(ROOT.glob(path))
    places = [ROOT / path, ROOT / "conductor_pipeline" / path, ARCHITECTURE.parent / path]
    return any(place.exists() for place in places) or any((ROOT / "conductor_pipeline").rglob(path))


def test_every_name_the_page_puts_in_backticks_is_in_the_code() -> None:
    words = code_words()
    names = [t for t in backticked(ARCHITECTURE.read_text()) if IDENTIFIER.fullmatch(t) and not PATH.fullmatch(t)]
    assert len(names) > 100  # the page names the code throughout; a parse that finds none checks nothing
    missing = sorted(t for t in names if not all(part in words for part in t.split(".")))
    assert not missing, f"docs/ARCHITECTURE.md names what the code no longer has: {missing}"


def test_every_path_the_page_names_exists() -> None:
    paths = [t for t in backticked(ARCHITECTURE.read_text()) if PATH.fullmatch(t) and "<" not in t]
    assert len(paths) > 30
    missing = sorted(t for t in paths if t not in RUNTIME_PATHS and not path_exists(t))
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"


@pytest.mark.parametrize(("claim", "holds"), FIGURES, ids=[claim for claim, _ in FIGURES])
def test_the_figures_the_page_states_are_the_codes(claim: str, holds: bool) -> None:
    assert claim in ARCHITECTURE.read_text(), f"the page no longer says {claim!r}: update FIGURES with it"
    assert holds, f"docs/ARCHITECTURE.md says {claim!r}, the code says otherwise"


def test_a_renamed_module_or_a_moved_path_would_fail() -> None:
    words = code_words()
    assert "no_such_module_anywhere" not in words and "lineup" in words
    assert not path_exists("conductor_pipeline/evaluation/no_such_module.py") and path_exists("evaluation/cascades.py")
