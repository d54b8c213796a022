# The two commands that do all the set-up on a fresh machine:
#   make demo   runs the demo notebooks headless and writes build/*.html
#   make test   runs the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install browser test test-oldest demo bench clean

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

demo: $(STAMP)
	$(BIN)/python notebooks/run_demo.py --out build --param N_ROWS=20_000 --param IMAGE_SIZE=128

bench: $(STAMP)
	$(BIN)/python benchmarks/load_time.py
	$(BIN)/python benchmarks/sampler_overhead.py
	$(BIN)/python benchmarks/lms_predict.py
	$(BIN)/python benchmarks/lms_fit_overhead.py
	$(BIN)/python benchmarks/lms_tune.py
	$(BIN)/python benchmarks/lms_soak.py
	$(BIN)/python benchmarks/lms_interrupts.py

clean:
	rm -rf build .pytest_cache
