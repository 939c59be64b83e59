"""Headless Debian chromium driven over the DevTools protocol (no extra package: `websockets` ships with
dagster-webserver), and the `dagster dev` process the browser tests look at.

Why not `chromium --screenshot`: the Dagster UI is a single-page app that renders after GraphQL
answers and hides markdown metadata behind clicks; the protocol lets a test wait for what it
checks, click, and screenshot exactly that state.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

# Flags of a throwaway headless browser that talks to nothing but the page it is pointed at.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # tests run as root in a container; the sandbox refuses root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",  # the browser picks a free port and writes it to DevToolsActivePort
]
DEBIAN_PACKAGE = "chromium"
BROWSER_START_TIMEOUT_S = 60.0
# `dagster dev` starts the webserver, the daemon and a code server that imports torch/transformers.
DAGSTER_START_TIMEOUT_S = 300.0
COMMAND_TIMEOUT_S = 60.0


def find_or_install_chromium() -> tuple[str | None, str]:
    """Path of a chromium binary, installing Debian's package as root when missing; else (None, why)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found, "found"
    if not shutil.which("apt-get"):
        return None, "chromium is not installed and this system has no apt-get to install Debian's package"
    if os.geteuid() != 0:
        return None, "chromium is not installed and installing Debian's package needs root (apt-get install chromium)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", DEBIAN_PACKAGE]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            return None, f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr.strip()[-400:]}"
    found = shutil.which("chromium")
    return (found, "installed") if found else (None, "apt-get installed chromium but no `chromium` is on PATH")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Page:
    """One browser tab: navigate, evaluate JavaScript, wait for a condition, click, screenshot."""

    def __init__(self, connection: ClientConnection) -> None:
        self._connection = connection
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        self._connection.send(json.dumps({"id": message_id, "method": method, "params": params}))
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while True:
            reply = json.loads(self._connection.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") == message_id:  # everything else is an event nobody subscribed to
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def set_viewport(self, width: int, height: int) -> None:
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def wait_for(self, expression: str, timeout_s: float = 60.0, what: str = "") -> Any:
        """Poll a JavaScript expression until it is truthy; its value, or TimeoutError naming `what`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                value = None  # the page is between documents
            if value:
                return value
            time.sleep(0.5)
        raise TimeoutError(f"waited {timeout_s:.0f}s for {what or expression}")

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """PNG of the page; `full_page` grows the viewport to the document height first."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


@contextmanager
def chromium_page(executable: str, user_data_dir: Path, width: int = 1600, height: int = 1100) -> Iterator[Page]:
    """A fresh headless chromium (own profile directory) and its first tab; killed on exit."""
    user_data_dir.mkdir(parents=True, exist_ok=True)
    port_file = user_data_dir / "DevToolsActivePort"
    port_file.unlink(missing_ok=True)  # a previous browser's port would point at nothing
    log = (user_data_dir / "chromium.log").open("wb")
    process = subprocess.Popen(
        [executable, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", f"--window-size={width},{height}",
         "about:blank"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + BROWSER_START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start; see {user_data_dir / 'chromium.log'}")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10, trust_env=False).json()
        page_target = next(t for t in targets if t["type"] == "page")
        with connect(page_target["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as connection:
            page = Page(connection)
            page.send("Page.enable")
            page.set_viewport(width, height)
            yield page
    finally:
        process.kill()
        process.wait(timeout=30)
        log.close()


@contextmanager
def dagster_dev(project_root: Path, dagster_home: Path, env: dict[str, str], log_path: Path) -> Iterator[str]:
    """`dagster dev` on 127.0.0.1 and a free port, up and with its code location loaded; yields the base URL."""
    port = free_port()
    log = log_path.open("wb")
    process = subprocess.Popen(
        [str(Path(project_root) / ".venv" / "bin" / "dagster"), "dev", "-w", "workspace.yaml",
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=project_root, env={**env, "DAGSTER_HOME": str(dagster_home)}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,  # dagster dev has children (webserver, daemon, code server): stop them together
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for_code_location(base_url, process, log_path)
        yield base_url
    finally:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=30)
        log.close()


LOCATIONS_QUERY = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"


def graphql(base_url: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    reply = httpx.post(
        f"{base_url}/graphql", json={"query": query, "variables": variables or {}}, timeout=60, trust_env=False
    )
    reply.raise_for_status()
    return reply.json()["data"]


def wait_for_code_location(base_url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + DAGSTER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dagster dev exited ({process.returncode}); see {log_path}")
        try:
            entries = graphql(base_url, LOCATIONS_QUERY)["workspaceOrError"]["locationEntries"]
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                return
        except (httpx.HTTPError, KeyError, TypeError):
            pass
        time.sleep(1.0)
    raise TimeoutError(f"dagster dev did not load its code location in {DAGSTER_START_TIMEOUT_S:.0f}s; see {log_path}")
