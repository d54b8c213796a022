"""The %%lms_fit dashboard in a real browser: JupyterLab 4 and Notebook 7 on localhost, Debian's Chromium
via Playwright.

The kernel runs with whatever IPython and ipywidgets the test process has: ipywidgets 8 in `make test`,
Colab's 7.7.1 (and IPython 7.34) in `make test-colab`, which sets LMS_MAGIC_EXPECT_IPYWIDGETS and
LMS_MAGIC_EXPECT_IPYTHON; the test reads the versions the kernel printed and checks them against those.
Skipped, with the reason in pytest's summary (-rs), where Chromium, JupyterLab, Notebook 7 or Playwright
is missing. Saves a screenshot to build/dashboard.png (JupyterLab) and build/dashboard-notebook.png.
"""

import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest

from lms_magic.lms.core.peak import KINDS

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
TOKEN = "lms-magic-test"
WAIT_MS = 300_000


# where each front end opens a notebook, and the module that serves it
FRONT_ENDS = {"lab": ("jupyterlab", "lab/tree"), "notebook": ("notebook", "notebooks")}
STACK_LINE = "kernel stack: "


def missing(module: str) -> list[str]:
    reasons = [] if pathlib.Path(CHROMIUM).exists() else ["Debian's chromium is not installed (apt-get install chromium)"]
    reasons += [f"{name} is not installed (pip install {name})" for name in (module, "playwright")
                if importlib.util.find_spec(name) is None]
    return reasons


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(params=sorted(FRONT_ENDS))
def front_end(request, tmp_path):
    """(front end, base URL, path that opens the notebook) of a server started for the test."""
    module, open_path = FRONT_ENDS[request.param]
    reasons = missing(module)
    if reasons:
        pytest.skip("browser test: " + "; ".join(reasons))
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import run_demo
    finally:
        sys.path.pop(0)
    notebook = nbformat.read(ROOT / "notebooks" / "lms_demo.ipynb", as_version=4)
    run_demo.set_parameters(notebook, {"N_ROWS": "800", "IMAGE_SIZE": "64"})
    notebook.cells.insert(0, nbformat.v4.new_code_cell(
        f"import IPython, ipywidgets; print('{STACK_LINE}IPython', IPython.__version__, 'ipywidgets', "
        "ipywidgets.__version__)"))
    nbformat.write(notebook, tmp_path / "lms_demo.ipynb")
    port = free_port()
    # JupyterLab's news prompt covered the dashboard in the screenshot: user settings of their own say no to it
    settings = tmp_path / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    server = subprocess.Popen([sys.executable, "-m", "jupyter", request.param, "--no-browser", "--allow-root",
                               f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={TOKEN}",
                               f"--ServerApp.root_dir={tmp_path}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL,
                              env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "lab-settings")})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        yield request.param, base, f"{open_path}/lms_demo.ipynb"
    finally:
        server.terminate()
        server.wait(timeout=30)


def kernel_state(base: str) -> str | None:
    """The execution state of the notebook's kernel, from the server's REST API (the same for both front ends)."""
    with urllib.request.urlopen(f"{base}/api/sessions?token={TOKEN}", timeout=5) as answer:
        sessions = json.load(answer)
    return sessions[0]["kernel"]["execution_state"] if sessions else None


def wait_for_idle_kernel(page, base: str, timeout_s: float = 120) -> None:
    """Until the notebook's kernel is idle, accepting the dialog JupyterLab sometimes shows to ask which kernel to
    start (a fixed wait for a dialog that may not come took 15 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if kernel_state(base) == "idle":
            return
        accept = page.query_selector(".jp-Dialog button.jp-mod-accept")
        if accept is not None:
            accept.click()
        page.wait_for_timeout(250)
    raise AssertionError(f"the kernel did not start within {timeout_s:.0f} s (state {kernel_state(base)!r})")


def test_dashboard_renders_in_the_browser(front_end):
    from playwright.sync_api import sync_playwright

    name, base, open_path = front_end
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/{open_path}?token={TOKEN}")
            page.wait_for_selector(".jp-Notebook", timeout=120_000)
            wait_for_idle_kernel(page, base)
            page.click("div.lm-MenuBar-itemLabel:text-is('Run')")
            page.click("div.lm-Menu-itemLabel:text-is('Run All Cells')")
            stack_output = page.locator(".jp-OutputArea-output", has_text=STACK_LINE).first
            stack_output.wait_for(timeout=120_000)
            stack = stack_output.text_content()  # read now: the first cell scrolls out of view as the rest runs
            try:
                headline = page.wait_for_selector(".lms-magic-headline", timeout=WAIT_MS)
            except Exception:
                (ROOT / "build").mkdir(exist_ok=True)
                page.screenshot(path=str(ROOT / "build" / f"browser_failure-{name}.png"), full_page=True)
                raise
            # read now, as the stack above: the cells that run after it scroll it out of view, and JupyterLab
            # then leaves its text undrawn (inner_text reads '')
            text = headline.text_content()
            page.wait_for_selector("text=test accuracy", timeout=300_000)
            for package, variable in (("IPython", "LMS_MAGIC_EXPECT_IPYTHON"), ("ipywidgets", "LMS_MAGIC_EXPECT_IPYWIDGETS")):
                if os.environ.get(variable):
                    assert f"{package} {os.environ[variable]}" in stack, stack
            assert text.startswith("LMS: ") and "final loss identical" in text and "step time" in text, text
            # the figures below it, drawn by plotly: peak bars (2 variants, device and host apart), the peak's
            # make-up (each kind), loss curves (2), the memory timeline; then the table
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 5", timeout=60_000)
            traces = page.evaluate("[...document.querySelectorAll('.js-plotly-plot')].map("
                                   "p => p.data.map(t => t.name))")
            assert traces[0] == ["no_lms", "lms", "no_lms", "lms"] and len(traces[1]) == len(KINDS), traces
            assert ["without LMS", "with LMS"] == [t for t in traces[2] if not t.endswith(": peak")], traces
            assert traces[3] == ["no_lms: loss", "lms: loss"], traces
            assert page.query_selector("table.lms-magic-fit") is not None
            assert page.query_selector(".jp-Notification-Toast, .Toastify__toast") is None  # nothing covers it
            (ROOT / "build").mkdir(exist_ok=True)
            headline.scroll_into_view_if_needed()
            page.wait_for_timeout(1500)  # JupyterLab draws the cells scrolled into view lazily
            shot = "dashboard.png" if name == "lab" else f"dashboard-{name}.png"
            page.screenshot(path=str(ROOT / "build" / shot), full_page=False)
        finally:
            browser.close()
