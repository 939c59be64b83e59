"""The Dagster UI in a real browser: after the default run, the asset graph, the eval tables, the
oracle ceilings and the pass rates render their tables and plots, and the eval tables page answers
the research questions without a click (every arm's verdict against the best single worker and the
conductor's result); screenshots land in a folder.

Slow (a full `python -m assets.main` into a temporary Dagster home and warehouse, then `dagster dev`):
    RUN_SLOW=1 .venv/bin/pytest tests/ui/test_ui_browser.py -q
To look at an existing run instead, point both variables at it:
    CORYPHAEUS_UI_DAGSTER_HOME=$PWD/.dagster_home CORYPHAEUS_WAREHOUSE=$PWD/artifacts/warehouse.duckdb \
    RUN_SLOW=1 .venv/bin/pytest tests/ui/test_ui_browser.py -q
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conductor_pipeline.paths import PROJECT_ROOT
from tests.ui.browser import Page, chromium_page, dagster_dev, find_or_install_chromium, graphql

pytestmark = pytest.mark.slow

# Knobs, with their reason.
SCREENSHOT_DIR = Path(os.environ.get("CORYPHAEUS_UI_SCREENSHOTS", PROJECT_ROOT / "artifacts" / "ui-screenshots"))
REUSE_HOME_ENV = "CORYPHAEUS_UI_DAGSTER_HOME"
MAIN_RUN_TIMEOUT_S = 3 * 3600  # the default run includes the CPU conductor's eval arm
WINDOW = (1900, 1300)  # wide enough for the arm table without horizontal scrolling
RENDER_TIMEOUT_S = 120.0

# Asset -> markdown metadata entries whose tables (and images) a person must be able to read.
PAGES: dict[str, list[str]] = {
    "eval_tables": ["conductor_vs_best_single", "verdicts", "arm_table", "paired_vs_best_single", "cost_story",
                    "cost_frontier", "routing_value", "decomposition", "accuracy_vs_cost_plot", "running_gap_plot"],
    "oracle_ceilings": ["ceilings"],
    "pass_rates": ["worker_accuracy", "status_rates", "pass_rate_plot"],
}

LATEST_MARKDOWN_QUERY = """
query Latest($key: AssetKeyInput!) {
  assetOrError(assetKey: $key) {
    ... on Asset { assetMaterializations(limit: 1) {
      runId
      metadataEntries { label ... on MarkdownMetadataEntry { mdStr } }
    } }
  }
}
"""

DISMISS_ONBOARDING_JS = """(() => {
  const skip = [...document.querySelectorAll('[role=dialog] button, button')].find(b => b.innerText.trim() === 'Skip');
  if (skip) { skip.click(); return true; } return false; })()"""

CLOSE_DIALOG_JS = """(() => {
  const close = [...document.querySelectorAll('[role=dialog] button')].find(b => b.innerText.trim() === 'Close');
  if (close) { close.click(); return true; } return false; })()"""

EXPAND_ONE_GROUP_JS = """(() => {
  const icon = document.querySelector('[aria-label=unfold_more]');
  if (!icon) return false; (icon.closest('button') || icon.parentElement).click(); return true; })()"""


def _open_markdown_js(label: str) -> str:
    """Click the entry's "[Show Markdown]" link (long markdown) or report it as rendered inline (short)."""
    return f"""(() => {{
  const row = [...document.querySelectorAll('tr')].find(r => r.cells.length && r.cells[0].innerText.trim() === {json.dumps(label)});
  if (!row) return null;
  const link = [...row.querySelectorAll('*')].find(e => e.children.length === 0 && e.textContent.trim() === '[Show Markdown]');
  if (link) {{ link.click(); return 'dialog'; }}
  row.scrollIntoView({{block: 'start'}});
  return 'inline'; }})()"""


def _rendered_js(label: str, where: str) -> str:
    """What the browser shows for the entry: table cell texts and images that decoded to real pixels."""
    root = (
        "document.querySelector('[role=dialog]')"
        if where == "dialog"
        else f"[...document.querySelectorAll('tr')].find(r => r.cells.length && r.cells[0].innerText.trim() === {json.dumps(label)})"
    )
    return f"""(() => {{
  const root = {root};
  if (!root) return null;
  return {{
    cells: [...root.querySelectorAll('th, td')].map(c => c.innerText.trim()),
    images: [...root.querySelectorAll('img')].filter(i => i.complete).map(i => ({{
      src: i.src.slice(0, 22), width: i.naturalWidth, height: i.naturalHeight, alt: i.alt }})),
    text: root.innerText }}; }})()"""


def _all_shown_js(texts: list[str]) -> str:
    return " && ".join(f"document.body.innerText.includes({json.dumps(t)})" for t in texts)


def markdown_table_cells(markdown: str) -> tuple[list[str], list[list[str]]]:
    """Header and body cells of the first markdown table in `markdown` (github pipe tables)."""
    rows = [line.strip() for line in markdown.splitlines() if line.strip().startswith("|")]
    parsed = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    body = [row for row in parsed[1:] if not all(re.fullmatch(r":?-+:?", cell) for cell in row)]
    return (parsed[0], body) if parsed else ([], [])


@pytest.fixture(scope="module")
def chromium() -> str:
    path, why = find_or_install_chromium()
    if path is None:
        pytest.skip(f"no headless browser: {why}")
    return path


@pytest.fixture(scope="module")
def materialized_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A Dagster home whose instance holds the default run, and the environment that finds its warehouse."""
    env = {**os.environ}
    if os.environ.get(REUSE_HOME_ENV):
        assert os.environ.get("CORYPHAEUS_WAREHOUSE"), f"{REUSE_HOME_ENV} needs CORYPHAEUS_WAREHOUSE of the same run"
        return Path(os.environ[REUSE_HOME_ENV]), env
    root = tmp_path_factory.mktemp("ui_run")
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "data" / "dagster.yaml", home / "dagster.yaml")
    env.update(DAGSTER_HOME=str(home), CORYPHAEUS_WAREHOUSE=str(root / "warehouse" / "warehouse.duckdb"))
    log_path = root / "main_run.log"
    with log_path.open("wb") as log:
        done = subprocess.run(
            [sys.executable, "-m", "assets.main"], cwd=PROJECT_ROOT, env=env, stdout=log,
            stderr=subprocess.STDOUT, timeout=MAIN_RUN_TIMEOUT_S,
        )
    # A failed gate makes the run exit 1 but still materializes what the UI shows; the pages check that.
    assert done.returncode in (0, 1), f"the default run crashed ({done.returncode}); see {log_path}"
    return home, env


@pytest.fixture(scope="module")
def ui(materialized_home: tuple[Path, dict[str, str]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home, env = materialized_home
    log_path = tmp_path_factory.mktemp("dagster_dev") / "dagster_dev.log"
    with dagster_dev(PROJECT_ROOT, home, env, log_path) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def page(chromium: str, ui: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    with chromium_page(chromium, tmp_path_factory.mktemp("chromium_profile"), *WINDOW) as browser_page:
        yield browser_page


def settle(page: Page, seconds: float = 3.0) -> None:
    """Let the UI finish its GraphQL round trips, and dismiss the community pop-up that can cover the page."""
    time.sleep(seconds)
    if page.evaluate(DISMISS_ONBOARDING_JS):
        time.sleep(1.0)


def test_asset_graph_renders_every_group_and_asset(page: Page, ui: str) -> None:
    page.navigate(f"{ui}/asset-groups")
    page.wait_for("document.body.innerText.includes('evaluation')", RENDER_TIMEOUT_S, "the asset groups")
    settle(page)
    page.screenshot(SCREENSHOT_DIR / "asset_graph_groups.png")
    for _ in range(10):  # groups start collapsed: expand each one
        if not page.evaluate(EXPAND_ONE_GROUP_JS):
            # Expanded groups push the collapsed ones out of view, where the UI does not draw them:
            # a fresh load fits the graph to the window again.
            page.navigate(f"{ui}/asset-groups")
            page.wait_for("document.body.innerText.includes('evaluation')", RENDER_TIMEOUT_S, "the asset groups")
            settle(page)
            if not page.evaluate(EXPAND_ONE_GROUP_JS):
                break
        time.sleep(2.0)
    page.navigate(f"{ui}/asset-groups")  # a fresh load fits the expanded graph to the window
    expected = ["questions", "probe_calls", *PAGES]
    page.wait_for(_all_shown_js(expected), RENDER_TIMEOUT_S, f"asset nodes {expected}")
    settle(page)
    page.screenshot(SCREENSHOT_DIR / "asset_graph.png")

    page.navigate(f"{ui}/assets/eval_tables?view=lineage&lineageScope=upstream&lineageDepth=10")
    # The graph shortens long names in the middle ("conduc…_checkpoint"): the tail identifies it.
    upstream = ["questions", "probe_calls", "pass_rates", "_checkpoint", "world_model", "eval_arms", "eval_tables"]
    page.wait_for(_all_shown_js(upstream), RENDER_TIMEOUT_S, f"the upstream lineage of eval_tables {upstream}")
    settle(page)
    page.screenshot(SCREENSHOT_DIR / "eval_tables_lineage.png")


@pytest.mark.parametrize("asset", list(PAGES))
def test_asset_page_renders_tables_and_plots(page: Page, ui: str, asset: str) -> None:
    latest = graphql(ui, LATEST_MARKDOWN_QUERY, {"key": {"path": [asset]}})["assetOrError"]["assetMaterializations"]
    assert latest, f"{asset} was never materialized by the default run"
    markdown = {e["label"]: e["mdStr"] for e in latest[0]["metadataEntries"] if "mdStr" in e}

    page.navigate(f"{ui}/assets/{asset}")
    page.wait_for(f"document.body.innerText.includes({json.dumps(PAGES[asset][-1])})", RENDER_TIMEOUT_S,
                  f"{asset}'s metadata")
    settle(page)
    page.screenshot(SCREENSHOT_DIR / f"{asset}.png")

    for label in PAGES[asset]:
        assert label in markdown, f"{asset} has no markdown entry {label!r} (has {sorted(markdown)})"
        where = page.evaluate(_open_markdown_js(label))
        assert where in ("dialog", "inline"), f"{asset}: no metadata row {label!r} on the page"
        if where == "dialog":
            page.wait_for("!!document.querySelector('[role=dialog]')", 30, f"{label}'s markdown dialog")
            time.sleep(1.5)
        shown = page.wait_for(_rendered_js(label, where), 30, f"{label} rendered")
        page.screenshot(SCREENSHOT_DIR / f"{asset}__{label}.png")
        if where == "dialog":
            page.evaluate(CLOSE_DIALOG_JS)
            time.sleep(1.0)

        if "data:image/png;base64," in markdown[label]:
            # The plot is a PNG data URI in markdown: the UI must decode it into an image with pixels.
            images = [i for i in shown["images"] if i["src"].startswith("data:image/png")]
            assert images and all(i["width"] > 100 and i["height"] > 100 for i in images), (label, shown["images"])
            continue
        header, body = markdown_table_cells(markdown[label])
        if not header:  # sentences or a list instead of a table (e.g. "no conductor arm"): the first is shown
            first = (rendered_lines(markdown[label]) or markdown[label].strip().splitlines())[0]
            assert " ".join(first.split())[:40] in " ".join(shown["text"].split()), (label, shown["text"][:200])
            continue
        rendered = set(shown["cells"])
        missing = [cell for cell in header + body[0] if cell and cell not in rendered]
        assert not missing, f"{asset}.{label}: cells {missing} of the markdown table are not rendered as table cells"


# Entries of eval_tables a reader must see without a click: Dagster shows shorter markdown inline.
INLINE_EVAL_ENTRIES = ["conductor_vs_best_single", "verdicts"]
INLINE_MARKDOWN_CHARS = 1000


def rendered_lines(markdown: str) -> list[str]:
    """The text a browser shows for each bullet of a markdown list (no bullet, no bold marks)."""
    return [line[2:].replace("**", "").strip() for line in markdown.splitlines() if line.startswith("- ")]


def test_eval_tables_shows_the_verdicts_and_the_conductor_without_a_click(page: Page, ui: str) -> None:
    reply = graphql(ui, LATEST_MARKDOWN_QUERY, {"key": {"path": ["eval_tables"]}})
    latest = reply["assetOrError"]["assetMaterializations"]
    assert latest, "eval_tables was never materialized by the default run"
    markdown = {e["label"]: e["mdStr"] for e in latest[0]["metadataEntries"] if "mdStr" in e}
    expected: list[str] = []
    for label in INLINE_EVAL_ENTRIES:
        assert len(markdown[label]) < INLINE_MARKDOWN_CHARS, f"{label} is too long to be shown inline"
        lines = rendered_lines(markdown[label])
        assert lines, f"{label} has no lines: {markdown[label][:200]!r}"
        expected += lines
    verdicts = rendered_lines(markdown["verdicts"])
    assert all(re.search(r": (beats|ties|loses)\b", line) for line in verdicts), verdicts
    assert any(line.startswith("conductor:") for line in verdicts), "no conductor row among the verdicts"

    page.navigate(f"{ui}/assets/eval_tables")
    page.wait_for(f"document.body.innerText.includes({json.dumps(INLINE_EVAL_ENTRIES[-1])})", RENDER_TIMEOUT_S,
                  "eval_tables' metadata")
    settle(page)
    shown = " ".join(page.text().split())
    missing = [line for line in expected if " ".join(line.split()) not in shown]
    page.screenshot(SCREENSHOT_DIR / "eval_tables__verdicts_inline.png")
    assert not missing, f"not on the page without a click: {missing}"
