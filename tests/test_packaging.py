"""The package as users install it: `python -m build` makes a wheel and an sdist that `twine check` accepts."""

import pathlib
import subprocess
import sys
import zipfile

import pytest

import lms_magic

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_and_sdist_build_and_pass_twine_check(tmp_path):
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next(tmp_path.glob("lms_magic-*.whl"))
    sdist = next(tmp_path.glob("lms_magic-*.tar.gz"))
    assert wheel.name == f"lms_magic-{lms_magic.__version__}-py3-none-any.whl"  # one version source
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "lms_magic/__init__.py" in names and "lms_magic/lms/peak.py" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/", "notebooks/")) for n in names)
    # a hosted notebook's widgets and shell are never upgraded: Colab has ipywidgets 7.7.1
    assert "Requires-Dist: ipywidgets>=7.6" in metadata and "License-Expression: Apache-2.0" in metadata
