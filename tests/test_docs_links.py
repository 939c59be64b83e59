"""The README and docs/ stay navigable: every relative link points at a file that exists, and the
README stays a page a newcomer reads in ten minutes: at most README_MAX_LINES lines and
README_MAX_WORDS words, its results block included (issue 43 asks for about 1,600), and no commit, date
or interval outside the block that `make results` writes (the research record is docs/LOG.md and
benchmarks/RESULTS-*.md)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from assets.results import replace_block

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 260
README_MAX_WORDS = 1650
# What belongs to the generated results block (or the research record), never to the README's prose.
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
INTERVAL = re.compile(r"\[[-+]?\d+(?:\.\d+)?, ?[-+]?\d+(?:\.\d+)?\]")
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`+[^`\n]*`+")
# [text](target) and ![alt](target), with an optional "title" after the target.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def relative_links(text: str) -> list[str]:
    """The relative link targets of a Markdown text, anchors stripped (code blocks and spans skipped)."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = []
    for target in LINK.findall(prose):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        path = unquote(target.split("#", 1)[0])
        if path:
            targets.append(path)
    return targets


def test_relative_links_parses_what_it_should() -> None:
    text = (
        "See [a](docs/a.md#part), ![img](../x.png \"t\"), [web](https://x.org/y.md), [here](#top),\n"
        "`[code](not/a/link.md)` and [b](<docs/b.md>).\n```\n[fenced](no.md)\n```\n"
    )
    assert relative_links(text) == ["docs/a.md", "../x.png", "docs/b.md"]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(page: Path) -> None:
    missing = [t for t in relative_links(page.read_text(encoding="utf-8")) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep it at most {README_MAX_LINES} (the reference goes in docs/)"


def test_readme_is_a_manual_not_a_lab_notebook() -> None:
    readme = README.read_text(encoding="utf-8")
    words = len(readme.split())
    assert words <= README_MAX_WORDS, f"README.md has {words} words; keep it at most {README_MAX_WORDS}"
    prose = replace_block(readme, "")
    found = {name: pattern.findall(prose) for name, pattern in
             {"commit": COMMIT, "date": DATE, "interval": INTERVAL}.items()}
    assert not any(found.values()), f"README.md outside the results block cites {found}: they go to docs/LOG.md"


@pytest.mark.parametrize(("pattern", "prose"), [
    (COMMIT, "recorded at commit 9415adb2df05"), (DATE, "measured on 2026-12-07"), (INTERVAL, "+3.1 [-1.8, +8.1] pts"),
])
def test_the_readme_check_finds_a_commit_a_date_and_an_interval(pattern: re.Pattern[str], prose: str) -> None:
    assert pattern.search(prose)
    assert not pattern.search("`make run` prints 0.505 on replay-test-six, six workers it never saw (see docs/)")
