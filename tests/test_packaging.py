"""The package as users install it: `python -m build` makes a wheel and an sdist that `twine check` accepts."""

import pathlib
import subprocess
import sys
import zipfile


import lms_magic

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
    sources = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "lms_magic").rglob("*.py"))
    assert sorted(name for name in names if name.endswith(".py")) == sources  # every subpackage is shipped
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/", "notebooks/")) for n in names)
    # a hosted notebook's widgets and shell are never upgraded: Colab has ipywidgets 7.7.1
    assert "Requires-Dist: ipywidgets>=7.6" in metadata and "License-Expression: Apache-2.0" in metadata
