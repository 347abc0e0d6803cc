# Facecast — every target creates or reuses the virtual environment itself.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.facecast-installed
ARGS ?=

.PHONY: setup sysdeps test test-fast lint typecheck format serve render bench soak clean

setup: $(STAMP)

# CPU torch 2.13.0 goes in first where there is no NVIDIA GPU, so the range in
# pyproject.toml is already satisfied and pip never pulls a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# Debian packages the tests use: a real browser and offline speech synthesis.
sysdeps:
	@bash scripts/install_sysdeps.sh

test: setup sysdeps
	$(PY) -m pytest -q $(ARGS)

# Everything but the `slow` and `browser` tests: the loop while editing, one worker a core,
# each with one torch thread (two threads a worker on two cores stall at every barrier).
# `make test` runs the slow tests too, in one process.
test-fast: setup sysdeps
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist worksteal -m "not slow and not browser" $(ARGS)

typecheck: setup
	$(VENV)/bin/mypy

lint: setup
	$(VENV)/bin/ruff check facecast pipeline realtime tests bench
	$(VENV)/bin/ruff format --check facecast pipeline realtime tests bench

format: setup
	$(VENV)/bin/ruff format facecast pipeline realtime tests bench
	$(VENV)/bin/ruff check --fix facecast pipeline realtime tests bench

serve: setup
	$(VENV)/bin/facecast serve $(ARGS)

render: setup
	$(VENV)/bin/facecast render --reference pipeline/assets/portraits/grace_hopper.jpg --audio pipeline/assets/sample_speech.wav --out out/sample.mp4 $(ARGS)

bench: setup
	$(VENV)/bin/facecast bench --config rt720 --seconds 20 --json bench/results/rt720.json --markdown bench/RESULTS.md $(ARGS)

# One hour-long call on the CPU, measured every 30 s (bench/soak.py; ARGS="--minutes 2").
soak: setup sysdeps
	$(PY) bench/soak.py $(ARGS)

clean:
	rm -rf $(VENV) out .pytest_cache
