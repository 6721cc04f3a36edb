"""Driving a JupyterLab page in headless Chromium, shared by the browser tests (JupyterLab, JupyterHub).

On a loaded 2-core machine JupyterLab can drop a keystroke, lose a cell sent while it reconnects to the
kernel, or open a dialog (a kernel choice, a connection warning) over the notebook: each step here waits
for its effect and tries again, and a dialog is accepted with its text printed for the log.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "output" / "test-artifacts"  # screenshots, kept for a person to look at
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def new_page(playwright):
    """A 1400×1000 page in a fresh headless Chromium (close it with page.context.browser.close())."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    return browser.new_page(viewport={"width": 1400, "height": 1000})


def accept_dialogs(page) -> list[str]:
    """Accept every JupyterLab dialog open over the page; their texts."""
    texts = []
    for dialog in page.locator("dialog.jp-Dialog").all():
        if not dialog.is_visible():
            continue
        texts.append(" ".join(dialog.inner_text().split())[:300])
        print(f"JupyterLab dialog accepted: {texts[-1]}", flush=True)
        dialog.locator(".jp-Dialog-button.jp-mod-accept").first.click()
    return texts


def wait_for_one_kernel(page, kernels_url: str, settle_s: float = 3.0, timeout_s: float = 90.0) -> str:
    """Wait until the server runs one kernel, the same for `settle_s`: on opening a notebook JupyterLab may
    start two and shut one down a moment later, and cells sent to that one are lost (seen on CI: the
    imports ran in the first kernel, the next cells in the second, NameError). `kernels_url`: the server's
    /api/kernels (…/user/<name>/api/kernels behind a hub), which the page's cookies authenticate."""
    deadline = time.time() + timeout_s
    seen, since = None, time.time()
    while time.time() < deadline:
        kernels = page.request.get(kernels_url).json()
        current = kernels[0]["id"] if len(kernels) == 1 else None
        if current != seen:
            seen, since = current, time.time()
        elif current and time.time() - since >= settle_s:
            return current
        time.sleep(0.5)
    pytest.fail(f"the server never settled on one kernel: {kernels}")


def _wait_for_status(page, cell_number: int, total: int, timeout_ms: int) -> None:
    page.wait_for_function(f"() => document.body.innerText.includes('Cell {cell_number}/{total}')",
                           timeout=timeout_ms)


def run_cells(page, first: int, stop: int, total: int) -> None:
    """Run cells first .. stop-1 (0-based) of a notebook of `total` cells with Shift+Enter.

    The first one is clicked and sent until it visibly ran (a code cell shows an execution count), since a
    cell sent while JupyterLab reconnects to a new kernel is lost. Each later press waits until the status
    bar shows the next cell active (JupyterLab numbers cells from 1) and is made again if nothing moved."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    cell = page.locator(".jp-Notebook .jp-Cell").nth(first)
    is_code = "jp-CodeCell" in (cell.get_attribute("class") or "")
    for _ in range(5):
        accept_dialogs(page)
        cell.click()
        page.keyboard.press("Shift+Enter")
        try:
            if is_code:
                page.wait_for_function("el => /\\[\\d+\\]/.test(el.innerText)",
                                       arg=cell.locator(".jp-InputPrompt").element_handle(), timeout=20_000)
            else:
                _wait_for_status(page, first + 2, total, 20_000)
            break
        except PlaywrightTimeout:
            continue
    else:
        pytest.fail(f"cell {first} never ran; dialogs: {accept_dialogs(page)}")
    for number in range(first + 3, stop + 2):
        for attempt in range(3):
            page.keyboard.press("Shift+Enter")
            try:
                _wait_for_status(page, number, total, 20_000)
                break
            except PlaywrightTimeout:
                accept_dialogs(page)
                if attempt == 2:
                    raise
