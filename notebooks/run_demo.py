"""Run the demo notebooks headless (nbclient), write them as HTML, print the figures.

Usage: python notebooks/run_demo.py [--out build] [--param NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import tempfile
import sys
import time

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbconvert import HTMLExporter

HERE = pathlib.Path(__file__).parent
DEMOS = ["gpumem_demo.ipynb", "lms_demo.ipynb", "large_images.ipynb"]
REPORT_LINE = re.compile(r"^(host: |GPU \d|note: |partial: |peak memory: )")


def parameters_cell(notebook):
    """The code cell that starts with ``# Parameters`` (after the install cell)."""
    return next(c for c in notebook.cells if c.cell_type == "code" and c.source.startswith("# Parameters"))


def set_parameters(notebook, overrides: dict[str, str]) -> None:
    """Rewrites ``NAME = value`` lines of the parameters cell."""
    cell = parameters_cell(notebook)
    for name, value in overrides.items():
        pattern = re.compile(rf"^{re.escape(name)}\s*=.*$", re.M)
        if not pattern.search(cell.source):
            raise SystemExit(f"unknown parameter {name}; the parameters cell is:\n{cell.source}")
        cell.source = pattern.sub(f"{name} = {value}", cell.source)


def run(path: pathlib.Path, out_dir: pathlib.Path, overrides: dict[str, str], timeout_s: int = 1200):
    notebook = nbformat.read(path, as_version=4)
    parameters = parameters_cell(notebook).source
    set_parameters(notebook, {k: v for k, v in overrides.items() if re.search(rf"^{re.escape(k)}\s*=", parameters, re.M)})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as sockets:
        # the kernel on local IPC sockets: no network port, and none of jupyter's "running over TCP without
        # encryption" warnings in make demo's output
        kernel = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(sockets, "kernel"))
        try:
            # cleanup_kc: the client's channels stopped with the kernel (given a kernel manager, nbclient keeps
            # them: a heartbeat thread a notebook, pinging a kernel that is gone, in the process that ran it)
            NotebookClient(notebook, km=kernel, timeout=timeout_s, store_widget_state=True,
                           resources={"metadata": {"path": str(path.parent)}}).execute(cleanup_kc=True)
        finally:
            if kernel.has_kernel:
                kernel.shutdown_kernel()
    elapsed_s = time.perf_counter() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path = out_dir / path.with_suffix(".html").name
    body, _ = HTMLExporter().from_notebook_node(notebook)
    html_path.write_text(body, encoding="utf-8")
    print(f"== {path.name}: executed in {elapsed_s:.1f} s, written to {html_path}")
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        first_line = cell.source.splitlines()[0] if cell.source else ""
        printing = "print(" in cell.source
        lines = [line for output in cell.get("outputs", []) if output.get("output_type") == "stream"
                 for line in output.get("text", "").splitlines() if printing or REPORT_LINE.match(line)]
        if lines:
            print(f"-- {first_line}")
            print("\n".join(f"   {line}" for line in lines))
    return notebook


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="build", help="folder for the HTML files (default build/)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="override a parameter of the notebooks' parameters cell")
    parser.add_argument("notebooks", nargs="*", default=DEMOS)
    args = parser.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.param)
    for name in args.notebooks:
        run(HERE / name, pathlib.Path(args.out), overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
