"""A student's read of an executed notebook in JupyterLab at 1366 × 768: every output fits its output area.

    overflows = walk(executed_notebook, "day2-student", tmp_path)   # [] when every output fits

The notebook tests execute a day headless (papermill); `walk` serves that notebook from a fresh JupyterLab, opens
it in headless Chromium at a laptop's size, measures each output against the width of its cell's output area, and
keeps a screenshot of each check's output (✅ ❌ ➖) in output/test-artifacts/walk-<name>/ for a person to read.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from jupyter_page import ARTIFACTS, new_page

LAPTOP = {"width": 1366, "height": 768}
PROBE = "DLOKIT_PROBE"  # the cell a notebook test appends to read values back
SCALED_BELOW = 0.95  # a figure shown smaller than it was drawn: its text shrinks with it (10 points read as 7 at 70 %)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def jupyterlab(root: Path, state: Path, env: dict | None = None):
    """JupyterLab serving `root` on 127.0.0.1 with its own config, data, runtime and settings folders under
    `state`; yields (url, token). Every cell is laid out (windowing off) so that off-screen outputs can be measured."""
    config = state / "jupyter-config"
    (config / "labconfig").mkdir(parents=True, exist_ok=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    settings = state / "lab-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_DATA_DIR": str(state / "jupyter-data"),
           "JUPYTER_RUNTIME_DIR": str(state / "jupyter-runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(state / "lab-settings"), **(env or {})}
    port, token = free_port(), "dlokit-test"
    log = state / "jupyterlab.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--ServerApp.port={port}",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError("JupyterLab did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.5)
    try:
        yield url, token
    finally:
        server.terminate()
        server.wait(timeout=30)


MEASURE = """(scaledBelow) => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].flatMap((cell, index) =>
  [...cell.querySelectorAll('.jp-OutputArea-output')].flatMap(output => {
    const found = [];
    const text = output.innerText.slice(0, 120).replace(/\\s+/g, ' ');
    if (output.scrollWidth > output.clientWidth + 1)
      found.push({cell: index, what: 'scrolls', width: output.scrollWidth, room: output.clientWidth, text});
    for (const img of output.querySelectorAll('img')) {
      if (img.naturalWidth && img.clientWidth < scaledBelow * img.naturalWidth)
        found.push({cell: index, what: 'figure shrunk', width: img.naturalWidth, room: img.clientWidth, text});
    }
    return found;
  }))"""
CHECK_CELLS = """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].map((cell, index) =>
  [...cell.querySelectorAll('.jp-OutputArea-output')].some(o => /[✅❌➖]/.test(o.innerText)) ? index : -1)
  .filter(index => index >= 0)"""


def walk(executed: Path, name: str, state: Path) -> list[dict]:
    """Open `executed` in JupyterLab at 1366 × 768 (file browser shown, as it opens); the outputs that scroll
    sideways or whose figure is shown at under 95 % of its size. Screenshots of each check's output land in
    output/test-artifacts/walk-<name>/."""
    from playwright.sync_api import sync_playwright

    root = state / "walk"
    (root / "notebooks").mkdir(parents=True, exist_ok=True)
    notebook = json.loads(executed.read_text())
    notebook["cells"] = [c for c in notebook["cells"] if PROBE not in "".join(c["source"])]  # the test's, not the day's
    (root / "notebooks" / executed.name).write_text(json.dumps(notebook))
    shots = ARTIFACTS / f"walk-{name}"
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    with jupyterlab(root, state / "walk-lab") as (url, token), sync_playwright() as playwright:
        page = new_page(playwright)
        page.set_viewport_size(LAPTOP)
        page.goto(f"{url}/lab/tree/notebooks/{executed.name}?token={token}")
        page.wait_for_selector(".jp-Notebook .jp-Cell .jp-OutputArea-output", timeout=90_000)
        page.wait_for_timeout(3000)  # the figures decoded, the tables laid out
        page.evaluate("() => Promise.all([...document.images].map(i => i.decode().catch(() => null)))")
        found = page.evaluate(MEASURE, SCALED_BELOW)
        cells = page.locator(".jp-Notebook .jp-Cell")
        for index in page.evaluate(CHECK_CELLS):
            cells.nth(index).locator(".jp-OutputArea").screenshot(path=str(shots / f"cell{index:03d}.png"))
        for problem in found:
            cells.nth(problem["cell"]).locator(".jp-OutputArea").screenshot(
                path=str(shots / f"cell{problem['cell']:03d}-{problem['what'].replace(' ', '-')}.png"))
        page.context.browser.close()
    return found


def assert_fits(executed: Path, name: str, state: Path) -> None:
    found = walk(executed, name, state)
    assert not found, f"outputs wider than JupyterLab's output area at 1366 px (see output/test-artifacts/walk-{name}):\n" + \
        "\n".join(f"cell {f['cell']}: {f['what']}, {f['width']} px in {f['room']}: {f['text']!r}" for f in found)
