"""The demo notebook executes headless (as `make demo` does), at a small size."""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpumem_demo_runs_and_reports(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import run_demo
    finally:
        sys.path.pop(0)
    notebook = run_demo.run(ROOT / "notebooks" / "gpumem_demo.ipynb", tmp_path, {"ARRAY_MIB": "32"})
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    printed = capsys.readouterr().out
    assert printed.count("host: peak memory") >= 3
    assert "TensorFlow allocator peak" in printed
    assert (tmp_path / "gpumem_demo.html").stat().st_size > 10_000
