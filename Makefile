# The quick start: `make demo` and `make test` on a fresh machine with Python >= 3.10.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test check lint bench

setup: $(VENV)/.installed

# torch is pinned by constraints.txt (its CPU build lies on the CI machine's disk).
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[examples,dev,ray,hf,tensorboard,mlflow,optuna]'
	touch $@

# A fresh run directory each time; trials stay in the catalog (~/.cache/dione).
demo: setup
	rm -rf runs/demo
	$(BIN)/dione run examples/demo.py --out runs/demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

# Two pytest workers (pytest-xdist): much of the suite waits on process start-up, Ray
# and timeouts rather than computing. Each test file runs whole in one worker, so a
# module's shared fixture (test_ray.py's one Ray cluster) is made once (xdist's
# loadgroup did not keep a group together under pytest 9).
# mypy (40-110 CPU-s without its cache, as on CI) checks types beside the tests, on the core
# they leave idle while waiting; its output follows theirs, and either failing fails.
# Every process the suite starts (ranks, spawners, CLIs) imports dione: its bytecode is
# written once here, where PYTHONDONTWRITEBYTECODE (set on our machines) has each process
# compile the sources again (about 7% of a gang-heavy test's time).
test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m compileall -q src
	$(BIN)/mypy > .mypy.log 2>&1 & types=$$!; \
	$(BIN)/python -m pytest -n 2 --dist loadfile; tests=$$?; \
	wait $$types; typed=$$?; cat .mypy.log; rm -f .mypy.log; \
	test $$tests -eq 0 && test $$typed -eq 0

# The inner loop (16-25 s with mypy's cache): lint, types, and the tests that start no gang
# (layering, schedules, planner, store, spec, batches). `make test` runs everything.
check: lint
	$(BIN)/python -m pytest -q -x tests/test_layers.py tests/test_schedules.py \
		tests/test_xpipe_links.py tests/test_plan.py tests/test_store.py tests/test_spec.py \
		tests/test_lane_ip.py tests/test_batches.py

bench: setup
	$(BIN)/python benchmarks/overhead.py
