"""Keras's own trainer, model and callback tests with ``LMS()`` in every ``fit`` (``make test-keras``).

Keras's source distribution on PyPI carries its tests. This fetches the one of the installed Keras's version,
runs the chosen test files against the installed Keras with ``lms_in_every_fit`` (each fit given ``LMS()``), then
runs the tests that failed again without LMS: a test that passes without LMS and fails with it fails this run.

    KERAS_BACKEND=jax python tests/keras_suite/run.py [--files keras/src/trainers/trainer_test.py ...]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ("keras/src/trainers/trainer_test.py", "keras/src/models/model_test.py",
         "keras/src/models/sequential_test.py", "keras/src/models/functional_test.py",
         *(f"keras/src/callbacks/{name}_test.py" for name in (
             "callback", "early_stopping", "model_checkpoint", "reduce_lr_on_plateau", "learning_rate_scheduler",
             "lambda_callback", "csv_logger", "terminate_on_nan", "backup_and_restore", "swap_ema_weights",
             "monitor_callback")))


def keras_tests(cache: Path, files) -> Path:
    """The test files of the installed Keras's sdist, under ``cache`` (fetched once)."""
    import keras

    version = keras.__version__
    folder = cache / f"keras-{version}"
    if not all((folder / name).exists() for name in files):
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", str(cache), f"keras=={version}"], check=True)
        with tarfile.open(cache / f"keras-{version}.tar.gz") as archive:
            members = [m for m in archive.getmembers() if m.name.endswith("_test.py") or m.name.endswith("conftest.py")]
            archive.extractall(cache, members=members, filter="data")
    tests = Path(tempfile.mkdtemp(prefix="keras-tests-"))
    for name in files:  # outside the sdist's tree, so that `keras` is the installed package
        target = tests / name.replace("/", "__")
        target.write_text((folder / name).read_text())
    return tests


def pytest(tests: Path, args: list[str], with_lms: bool) -> tuple[int, set[str], str]:
    """Runs pytest over ``tests``; its exit code, the failed test ids, and its last lines."""
    env = {**os.environ, "LMS_IN_EVERY_FIT": "1" if with_lms else "0", "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.keras_suite.lms_in_every_fit",
                           "-p", "no:cacheprovider", "-W", "ignore", "-o", "addopts=", "-rf", "--rootdir",
                           str(tests), *args], cwd=tests, env=env, capture_output=True, text=True)
    failed = set(re.findall(r"^FAILED (\S+)", done.stdout, re.M))
    return done.returncode, failed, "\n".join(done.stdout.strip().splitlines()[-3:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=list(FILES))
    parser.add_argument("--cache", default=str(ROOT / "build" / "keras-sdist"))
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (-k, -n 2)")
    options = parser.parse_args()
    tests = keras_tests(Path(options.cache), options.files)
    try:
        return _run(tests, options.pytest_args)
    finally:
        shutil.rmtree(tests, ignore_errors=True)


def _run(tests: Path, pytest_args: list[str]) -> int:
    """Keras's tests with LMS, the failures again without it; the exit code."""
    code, failed, tail = pytest(tests, [str(tests), *pytest_args], with_lms=True)
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    print(f"Keras's tests with LMS() in every fit ({backend}): {tail}")
    if code not in (0, 1):
        print(f"pytest ended with code {code}")
        return code
    counts = {word: int(number) for number, word in re.findall(r"(\d+) (passed|skipped)", tail)}
    only_with_lms = []
    if failed:
        _, still, _ = pytest(tests, sorted(failed), with_lms=False)
        only_with_lms = sorted(failed - still)
        print(f"{len(failed)} failed with LMS; {len(failed) - len(only_with_lms)} of them fail without it too "
              "(counted as skipped below)")
    for name in only_with_lms:
        print(f"FAILED ONLY WITH LMS: {name}")
    # the closing line CI reads: a test failing without LMS as well is not LMS's
    print(f"{counts.get('passed', 0)} passed, {len(only_with_lms)} failed, "
          f"{counts.get('skipped', 0) + len(failed) - len(only_with_lms)} skipped")
    return 1 if only_with_lms else 0


if __name__ == "__main__":
    sys.exit(main())
