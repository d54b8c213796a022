# The two commands that do all the set-up on a fresh machine:
#   make demo   runs the demo notebooks headless and writes build/*.html
#   make test   runs the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install browser test test-oldest test-colab wheel demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Debian's Chromium for the browser test; where it cannot be installed, that test is skipped with the reason.
browser:
	-test -x /usr/bin/chromium || (test "$$(id -u)" = 0 && command -v apt-get >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1) || true

# Keras fixes its backend per process: the PyTorch backend's tests run in a second pytest.
test: $(STAMP) browser
	$(BIN)/python -m pytest
	KERAS_BACKEND=torch $(BIN)/python -m pytest tests/torch_backend lms_magic/lms/torch_offload.py -p no:warnings

# The LMS tests on the oldest supported TensorFlow / Keras pair (lms_magic/compat.py SUPPORTED), in a venv of its own.
OLDEST := .venv-oldest
$(OLDEST)/.installed: pyproject.toml
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet -e . pytest memory-profiler "tensorflow-cpu==2.17.*" "keras==3.5.*" "numpy<2"
	touch $(OLDEST)/.installed

test-oldest: $(OLDEST)/.installed
	$(OLDEST)/bin/python -m pytest tests/lms tests/test_magics.py -p no:warnings

# The notebook-facing tests (magics, tuner, %%lms_fit, the demo notebooks headless and in the browser) again on
# what Colab ships: IPython 7.34, ipywidgets 7.7.1, TensorFlow 2.19 / Keras 3.10, in a venv of its own
# (make test has IPython 9, ipywidgets 8, the newest TensorFlow and Keras).
COLAB := .venv-colab
$(COLAB)/.installed: pyproject.toml
	test -x $(COLAB)/bin/python || $(PYTHON) -m venv $(COLAB)
	$(COLAB)/bin/python -m pip install --quiet --upgrade pip
	$(COLAB)/bin/python -m pip install --quiet -e . pytest memory-profiler nbclient nbformat nbconvert ipykernel \
		jupyterlab notebook playwright "tensorflow-cpu==2.19.*" "keras==3.10.*" "ipython==7.34.0" "ipywidgets==7.7.1"
	touch $(COLAB)/.installed

test-colab: $(COLAB)/.installed browser
	LMS_MAGIC_EXPECT_IPYWIDGETS=7.7.1 LMS_MAGIC_EXPECT_IPYTHON=7.34 LMS_MAGIC_EXPECT_TENSORFLOW=2.19 \
		LMS_MAGIC_EXPECT_KERAS=3.10 $(COLAB)/bin/python -m pytest tests/test_magics.py tests/lms/test_tuning.py \
		tests/lms/test_fit_magic.py tests/test_notebooks.py tests/test_browser.py -p no:warnings

# The wheel and sdist users install (dist/), checked as PyPI would.
wheel: $(STAMP)
	$(BIN)/python -m build --outdir dist
	$(BIN)/python -m twine check --strict dist/*

demo: $(STAMP)
	$(BIN)/python notebooks/run_demo.py --out build --param N_ROWS=20_000 --param IMAGE_SIZE=128

bench: $(STAMP)
	$(BIN)/python benchmarks/load_time.py
	$(BIN)/python benchmarks/sampler_overhead.py
	$(BIN)/python benchmarks/lms_predict.py
	$(BIN)/python benchmarks/lms_fit_overhead.py
	$(BIN)/python benchmarks/lms_tune.py
	$(BIN)/python benchmarks/dashboard_draw.py
	$(BIN)/python benchmarks/lms_soak.py
	$(BIN)/python benchmarks/lms_interrupts.py

clean:
	rm -rf build .pytest_cache
