# The two commands that do all the set-up on a fresh machine:
#   make demo   runs the demo notebooks headless and writes build/*.html
#   make test   runs the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install browser test test-keras test-release test-all test-oldest test-colab wheel demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	# KerasHub's backbones in the tests, built from a config: keras-hub declares tensorflow-text, which pins a
	# TensorFlow of its own, so it is installed without its dependencies (the few it imports are in [test])
	$(BIN)/python -m pip install --quiet --no-deps "keras-hub==0.32.*"
	# KerasHub's tokenizers (a causal LM fed text) need tensorflow-text of the installed TensorFlow's minor version;
	# where PyPI has none, the tests of text are skipped with the reason
	-$(BIN)/python -m pip install --quiet --no-deps "tensorflow-text==$$($(BIN)/python -c \
		'import importlib.metadata as m; print(".".join(m.version("tensorflow-cpu").split(".")[:2]))').*"
	touch $(STAMP)

install: $(STAMP)

# Debian's Chromium for the browser test; where it cannot be installed, that test is skipped with the reason.
browser:
	-test -x /usr/bin/chromium || (test "$$(id -u)" = 0 && command -v apt-get >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1) || true

# Every behaviour's test, the real architectures at their smallest (tests/lms/tensorflow/test_real_models.py says
# which model shows what). Keras fixes its backend per process: the PyTorch and JAX backends' tests run in pytests of
# their own.
# The tests run in parallel (pytest-xdist: a process a core, at most 4, idle ones taking tests from busy ones).
TORCH_TESTS := tests/lms/torch lms_magic/lms/torch
JAX_TESTS := tests/lms/jax lms_magic/lms/jax
# tests/conftest.py keeps tests/lms/{torch,jax} out of the TensorFlow run; the packages' doctests, which that conftest
# does not reach, are left out here
OTHER_BACKENDS := --ignore=lms_magic/lms/torch --ignore=lms_magic/lms/jax
# The dashboard in the browser: JupyterLab here, the classic notebook too in test-colab.
PARALLEL := -n auto --maxprocesses=4 --dist worksteal
ONE_BROWSER := --deselect 'tests/test_browser.py::test_dashboard_renders_in_the_browser[notebook]'
test: $(STAMP) browser
	$(BIN)/python -m pytest $(PARALLEL) --durations=10 $(ONE_BROWSER) $(OTHER_BACKENDS)
	KERAS_BACKEND=torch $(BIN)/python -m pytest $(PARALLEL) $(TORCH_TESTS) -p no:warnings
	KERAS_BACKEND=jax $(BIN)/python -m pytest $(PARALLEL) $(JAX_TESTS) -p no:warnings

# Keras's own trainer tests (from the installed Keras's sdist on PyPI) with LMS() added to every fit, on each
# backend: a test that passes without LMS and fails with it fails the target (tests/keras_suite/run.py).
# KERAS_SUITE=all adds Keras's model, Sequential, Functional and callback tests.
KERAS_SUITE ?= keras/src/trainers/trainer_test.py
KERAS_SUITE_FILES := $(if $(filter all,$(KERAS_SUITE)),,--files $(KERAS_SUITE))
test-keras: $(STAMP)
	for backend in tensorflow torch jax; do \
		KERAS_BACKEND=$$backend $(BIN)/python tests/keras_suite/run.py $(KERAS_SUITE_FILES) -- -n 2 || exit 1; done

# Before a release: make test's tests and the `release` ones too: the full-size keras.applications models with both
# optimizers, all 60 seeded fault cases, the 120-call soak, the checks of explain_fit's shortcuts on full models
# against their own traces, the replay against the allocator's peak. (test-all: its old name.)
test-release: $(STAMP) browser
	LMS_SOAK_CALLS=120 $(BIN)/python -m pytest $(PARALLEL) --durations=10 -m "release or not release" $(OTHER_BACKENDS)
	KERAS_BACKEND=torch $(BIN)/python -m pytest $(PARALLEL) $(TORCH_TESTS) -p no:warnings -m "release or not release"
	KERAS_BACKEND=jax $(BIN)/python -m pytest $(PARALLEL) $(JAX_TESTS) -p no:warnings

test-all: test-release

# What depends on the TensorFlow / Keras version (the rewrite, the backend, the callback, the magics, one real
# model), run again by test-oldest and test-colab; the pure modules and the rest run once, in make test.
ONE_REAL_MODEL := 'tests/lms/tensorflow/test_real_models.py::test_lms_on_a_real_architecture[resnet-sgd]' \
	'tests/lms/tensorflow/test_same_math.py::test_every_lms_plan_trains_bit_identically_to_a_reproducible_plain_fit[transformer-adam]'
VERSIONED := tests/lms/test_callback.py tests/lms/tensorflow/test_rewrite.py tests/lms/tensorflow/test_backend.py \
	tests/lms/tensorflow/test_predict.py tests/lms/tensorflow/test_recompute.py tests/lms/tensorflow/test_hybrid.py \
	tests/lms/tensorflow/test_lean.py tests/lms/tensorflow/test_order.py tests/lms/tensorflow/test_rescale.py \
	tests/ipython/test_magics.py tests/fit/test_compare.py \
	$(ONE_REAL_MODEL)

# The LMS tests on the oldest supported TensorFlow / Keras pair (lms_magic/versions.py SUPPORTED), in a venv of its own.
OLDEST := .venv-oldest
$(OLDEST)/.installed: pyproject.toml
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet -e . pytest pytest-xdist memory-profiler "tensorflow-cpu==2.17.*" \
		"keras==3.5.*" "numpy<2"
	touch $(OLDEST)/.installed

test-oldest: $(OLDEST)/.installed
	$(OLDEST)/bin/python -m pytest $(PARALLEL) $(VERSIONED) -p no:warnings

# The version-dependent tests and the notebook-facing ones (%lms_tune and its widget, the dashboard, the demo
# notebooks headless and in the browser) again on what Colab ships: IPython 7.34, ipywidgets 7.7.1, TensorFlow
# 2.19 / Keras 3.10, in a venv of its own (make test has IPython 9, ipywidgets 8, the newest TensorFlow and Keras).
COLAB := .venv-colab
$(COLAB)/.installed: pyproject.toml
	test -x $(COLAB)/bin/python || $(PYTHON) -m venv $(COLAB)
	$(COLAB)/bin/python -m pip install --quiet --upgrade pip
	$(COLAB)/bin/python -m pip install --quiet -e . pytest pytest-xdist memory-profiler nbclient nbformat nbconvert ipykernel \
		jupyterlab notebook playwright "tensorflow-cpu==2.19.*" "keras==3.10.*" "ipython==7.34.0" "ipywidgets==7.7.1"
	touch $(COLAB)/.installed

test-colab: $(COLAB)/.installed browser
	LMS_MAGIC_EXPECT_IPYWIDGETS=7.7.1 LMS_MAGIC_EXPECT_IPYTHON=7.34 LMS_MAGIC_EXPECT_TENSORFLOW=2.19 \
		LMS_MAGIC_EXPECT_KERAS=3.10 $(COLAB)/bin/python -m pytest $(PARALLEL) $(VERSIONED) tests/ipython/test_lms_tune.py tests/ui \
		tests/test_notebooks.py tests/test_browser.py -p no:warnings

# The wheel and sdist users install (dist/), checked as PyPI would.
wheel: $(STAMP)
	$(BIN)/python -m build --outdir dist
	$(BIN)/python -m twine check --strict dist/*

demo: $(STAMP)
	$(BIN)/python notebooks/run_demo.py --out build --param N_ROWS=20_000 --param IMAGE_SIZE=128

# The benchmark suite (benchmarks/run.py: the registry, one table in benchmarks/results/bench-DATE.md);
# `make bench NAME=explain_speed` runs one, `NAME="a b"` several; `benchmarks/run.py --list` names them.
bench: $(STAMP)
	$(BIN)/python benchmarks/run.py $(NAME)

clean:
	rm -rf build .pytest_cache
