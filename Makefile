# Facecast — every target creates or reuses the virtual environment itself.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.facecast-installed
LOCK := requirements/lock.txt
TORCH := requirements/torch.txt
PIP_VERSION := 26.3
# pip-compile's own environment (make lock), apart from the project's
TOOLS := .venv-tools
ARGS ?=

.PHONY: setup lock test-newest sysdeps test test-fast lint typecheck format serve render bench soak clean

setup: $(STAMP)

# The locked install: torch first (requirements/torch.txt says which build a machine gets),
# then every other dependency at the version and hash in the lock, with no resolving
# (--no-deps: the lock is complete), then the project itself; `pip check` fails the set-up
# where the lock and the torch build disagree.
$(STAMP): $(LOCK) $(TORCH) pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q pip==$(PIP_VERSION)
	$(PY) -m pip install -q -r $(TORCH)
	$(PY) -m pip install -q --require-hashes --no-deps -r $(LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $(STAMP)

# Rewrite the lock from pyproject.toml's ranges, each dependency at its newest allowed
# version (README: when to run it). torch is left out (--unsafe-package) but resolved
# against its pin, and so is the project itself (the test extra names facecast[fleet]).
lock:
	test -x $(TOOLS)/bin/python || python3 -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q pip==$(PIP_VERSION) pip-tools==7.6.2
	$(TOOLS)/bin/pip-compile --quiet --upgrade --generate-hashes --extra test \
		--constraint $(TORCH) --unsafe-package torch --unsafe-package facecast \
		--no-emit-index-url --no-emit-find-links --output-file $(LOCK) pyproject.toml

# The canary: the newest versions pyproject.toml's ranges allow, in a scratch venv, against
# the real-model and loader tests; prints what differs from the lock. Not part of CI.
NEWEST := .venv-newest
test-newest:
	rm -rf $(NEWEST)
	python3 -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install -q pip==$(PIP_VERSION)
	$(NEWEST)/bin/python -m pip install -q -r $(TORCH)
	$(NEWEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -c $(TORCH) -e '.[test]'
	$(NEWEST)/bin/python scripts/test_newest.py $(ARGS)

# Debian packages the tests use: a real browser and offline speech synthesis.
sysdeps:
	@bash scripts/install_sysdeps.sh

# CI's suite in two runs: what make test-fast runs (a worker per core), then the `slow` and
# `browser` tests in one process of their own, one at a time (live timings fail when
# they share the two cores); exit 5 is a run that ARGS left with no test.
# The agent session that no timer may end is held LONG_SESSION_S here, six times the
# longest timer on its path (ICE consent's 30 s); its own default is the README's 10 minutes
# (LONG_SESSION_S=600 for that), 7 minutes of CI's clock.
LONG_SESSION_S ?= 180
test: setup sysdeps
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist worksteal -m "not slow and not browser" $(ARGS) || test $$? -eq 5
	FACECAST_LONG_SESSION_S=$(LONG_SESSION_S) $(PY) -m pytest -q -m "slow or browser" $(ARGS) || test $$? -eq 5

# Everything but the `slow` and `browser` tests: the loop while editing, one worker a core,
# each with one torch thread (two threads a worker on two cores stall at every barrier).
# `make test` runs these the same way, then the slow ones.
test-fast: setup sysdeps
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist worksteal -m "not slow and not browser" $(ARGS)

typecheck: setup
	$(VENV)/bin/mypy

lint: setup
	$(VENV)/bin/ruff check facecast facecast_client pipeline realtime tests bench
	$(VENV)/bin/ruff format --check facecast facecast_client pipeline realtime tests bench

format: setup
	$(VENV)/bin/ruff format facecast facecast_client pipeline realtime tests bench
	$(VENV)/bin/ruff check --fix facecast facecast_client pipeline realtime tests bench

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
