"""The demo notebook executes headless (as `make demo` does), at a small size."""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_notebook(name, tmp_path, parameters):
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import run_demo
    finally:
        sys.path.pop(0)
    notebook = run_demo.run(ROOT / "notebooks" / name, tmp_path, parameters, timeout_s=300)
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    # quiet: no TensorFlow start-up lines (the tests force oneDNN on, whose notice ignores TF_CPP_MIN_LOG_LEVEL)
    stderr = [o["text"] for c in notebook.cells for o in c.get("outputs", []) if o.get("name") == "stderr"]
    assert not any("oneDNN" in text or "absl::InitializeLog" in text for text in stderr), stderr
    return notebook


def test_gpumem_demo_runs_and_reports(tmp_path, capsys):
    run_notebook("gpumem_demo.ipynb", tmp_path, {"ARRAY_MIB": "32"})
    printed = capsys.readouterr().out
    assert printed.count("host: peak memory") >= 3
    assert "TensorFlow allocator peak" in printed
    assert (tmp_path / "gpumem_demo.html").stat().st_size > 10_000


def test_lms_demo_shows_the_win_then_the_seed_experiment_headless(tmp_path, capsys):
    # the simulated device sized from this machine's measured step (kernels' scratch differs by CPU)
    notebook = run_notebook("lms_demo.ipynb", tmp_path, {"N_ROWS": "800", "IMAGE_SIZE": "64"})
    printed = capsys.readouterr().out
    assert "test accuracy" in printed and "plan: fits the device; swapped per step: 0 bytes" in printed
    # before part 1's fit, why it does not fit: the convolutions fill the peak, and %%lms_fit trains the batch
    assert "the layers holding the most at the peak: conv2d" in printed and "put `%%lms_fit" in printed
    assert "measured: plain steps held" in printed  # held to the simulated device's allocator
    outputs = [o.get("data", {}) for c in notebook.cells for o in c.get("outputs", [])]
    tables = [d["text/plain"] for d in outputs if "lms - no_lms" in d.get("text/plain", "")]
    assert len(tables) == 2  # each dashboard's table, once: `-o` does not show it again as Out
    for table in tables:
        loss_row = next(line for line in table.splitlines() if "final loss" in line).split()
        assert loss_row[2] == loss_row[3]  # the same loss with and without LMS
    win, seed = [d["text/plain"] for d in outputs if "lms-magic-headline" in d.get("text/html", "")]
    # part 1: the step does not fit the device without LMS (as measured by explain_fit's plain step) and does with
    # it: the peak down, measured both ways where LMS's checked step was read
    assert win.startswith(("LMS: without LMS the step would not fit the budget (",
                           "LMS: without LMS the step would not fit the device (")) and "with LMS it fits" in win
    drop = int(win.split("device peak -")[1].split("%")[0])
    assert drop > 0 and "final loss identical" in win and "tensors swapped" in win
    # one story: the dashboard's figure without LMS is the plain step explain_fit measured at that batch
    without = next(line.strip() for line in printed.splitlines() if line.strip().startswith("without LMS: "))
    assert f"({without.removeprefix('without LMS: ').split(' at batch')[0]} measured" in win
    # part 2: the small model fits, nothing moves, and a step-time difference is not called a cost
    assert seed.startswith("LMS: the model fits the device") and ": nothing moved" in seed
    assert "final loss identical" in seed
    figures = [d for d in outputs if "application/vnd.plotly.v1+json" in d]
    assert len(figures) >= 4 and all("plotly-graph-div" in d["text/html"] for d in figures)
    page = (tmp_path / "lms_demo.html").read_text()
    assert '"measured device peak"' in page  # the bars show the headline's measured pair
    # visible offline, each dashboard on its own: plotly.js inline once in each of the two cells with figures
    assert 'src="https://cdn.plot.ly' not in page and page.count('class="plotly-graph-div"') >= 8
    assert page.count("plotly.js v") == 2 and "lms-magic-headline" in page
    assert (tmp_path / "lms_demo.html").stat().st_size < 2 * 5.5 * 2**20


def test_large_images_notebook_predicts_a_lower_peak(tmp_path, capsys):
    run_notebook("large_images.ipynb", tmp_path, {"IMAGE_SIZE": "64", "STEPS": "3"})
    line = next(line for line in capsys.readouterr().out.splitlines() if "predicted accelerator peak" in line)
    with_lms, without = [float(part.split()[0]) for part in line.split(":")[1].split(",")[:2]]
    assert with_lms < without


@pytest.mark.parametrize("package, variable", [("ipywidgets", "LMS_MAGIC_EXPECT_IPYWIDGETS"),
                                               ("IPython", "LMS_MAGIC_EXPECT_IPYTHON"),
                                               ("tensorflow", "LMS_MAGIC_EXPECT_TENSORFLOW"),
                                               ("keras", "LMS_MAGIC_EXPECT_KERAS")])
def test_the_notebook_kernel_runs_the_versions_the_run_says(package, variable):
    """The demo notebooks' kernel (started as run_demo starts it, in notebooks/) imports the versions that
    `make test-colab` names: a relative PYTHONPATH once left it on the main venv's IPython 9 and ipywidgets 8."""
    import os

    import nbformat
    from nbclient import NotebookClient

    expected = os.environ.get(variable)
    if expected is None:
        pytest.skip("only `make test-colab` says which versions it runs with")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"import {package}; print({package}.__version__)")])
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    version = notebook.cells[0].outputs[0]["text"].strip()
    assert version.startswith(expected), version


@pytest.mark.parametrize("name, extra", [("gpumem_demo.ipynb", " memory_profiler"), ("lms_demo.ipynb", ""),
                                         ("large_images.ipynb", "")])
def test_each_demo_starts_with_the_readmes_install_line_then_loads_the_extension(name, extra):
    import nbformat

    import lms_magic

    wheel = f"lms_magic-{lms_magic.__version__}-py3-none-any.whl"
    code = [cell.source for cell in nbformat.read(ROOT / "notebooks" / name, as_version=4).cells
            if cell.cell_type == "code"]
    assert code[0].startswith("# Install") and code[0].rstrip().endswith(f"%pip install -q {wheel}{extra}")
    assert f"%pip install -q {wheel}" in (ROOT / "README.md").read_text()
    assert code[1].startswith("# Parameters") and "%load_ext lms_magic" in code[2]
