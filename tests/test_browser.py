"""The %%lms_fit dashboard in a real browser: JupyterLab on localhost, Debian's Chromium via Playwright.

Skipped, with the reason in pytest's summary (-rs), where Chromium, JupyterLab or
Playwright is missing. Saves a screenshot to build/dashboard.png.
"""

import importlib.util
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
TOKEN = "lms-magic-test"
WAIT_MS = 300_000


def missing() -> list[str]:
    reasons = [] if pathlib.Path(CHROMIUM).exists() else ["Debian's chromium is not installed (apt-get install chromium)"]
    reasons += [f"{name} is not installed (pip install {name})" for name in ("jupyterlab", "playwright")
                if importlib.util.find_spec(name) is None]
    return reasons


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    reasons = missing()
    if reasons:
        pytest.skip("browser test: " + "; ".join(reasons))
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import run_demo
    finally:
        sys.path.pop(0)
    notebook = nbformat.read(ROOT / "notebooks" / "lms_demo.ipynb", as_version=4)
    run_demo.set_parameters(notebook, {"N_ROWS": "2_000"})
    nbformat.write(notebook, tmp_path / "lms_demo.ipynb")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
                               f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={TOKEN}",
                               f"--ServerApp.root_dir={tmp_path}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_dashboard_renders_in_jupyterlab(jupyterlab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{jupyterlab}/lab/tree/lms_demo.ipynb?token={TOKEN}")
            page.wait_for_selector(".jp-Notebook", timeout=120_000)
            try:  # JupyterLab sometimes asks which kernel to start
                page.click(".jp-Dialog button.jp-mod-accept", timeout=15_000)
            except Exception:
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
            page.click("div.lm-MenuBar-itemLabel:text-is('Run')")
            page.click("div.lm-Menu-itemLabel:text-is('Run All Cells')")
            try:
                tab = page.wait_for_selector(".widget-tab", timeout=WAIT_MS)
            except Exception:
                (ROOT / "build").mkdir(exist_ok=True)
                page.screenshot(path=str(ROOT / "build" / "browser_failure.png"), full_page=True)
                raise
            page.wait_for_selector("text=test accuracy", timeout=300_000)
            text = tab.inner_text()
            assert "Summary" in text and "Memory" in text and "Training" in text
            assert "lms - no_lms" in text and "final loss" in text
            tab.query_selector("li.lm-TabBar-tab:has-text('Training')").click()
            # both variants' loss curves, drawn by plotly in the Training tab
            page.wait_for_function("document.querySelectorAll('.widget-tab .js-plotly-plot .scatterlayer .trace')"
                                   ".length >= 2", timeout=60_000)
            tab.query_selector("li.lm-TabBar-tab:has-text('Summary')").click()
            (ROOT / "build").mkdir(exist_ok=True)
            tab.scroll_into_view_if_needed()
            page.screenshot(path=str(ROOT / "build" / "dashboard.png"), full_page=False)
            tab.screenshot(path=str(ROOT / "build" / "dashboard_tab.png"))
        finally:
            browser.close()
