# The two commands the README promises: `make demo` and `make test`; and `make check`, the tier
# to run while working (docs/development.md, "Test tiers").
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo check unit typecheck test test-spark test-rest lint bench clean fuzz-properties

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

# Starts an embedded Tansu broker and the proxy, runs two producers (one held to a quota, one
# free) and a consumer through it with a live view, and stops by itself (or on Ctrl-C), leaving
# nothing running.
demo: $(STAMP)
	$(BIN)/python -m devkit.demo

PYTEST := $(BIN)/pytest -q -p no:cacheprovider
# The unit and in-process tests: no Tansu, no Spark, nothing that takes more than a few seconds.
FAST := not integration and not spark and not slow
# Workers for `make test`: its tests mostly wait (on Tansu, on quotas, on consumer-group joins),
# so more workers than cores; measured on two cores in docs/development.md.
TEST_WORKERS ?= 4

# Under a minute: lint, then mypy beside the fast tests (each one's output printed whole as it ends).
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(MAKE) --no-print-directory -j2 --output-sync=target typecheck unit

unit: $(STAMP)
	$(PYTEST) -n 2 -m "$(FAST)"

typecheck: $(STAMP)
	$(BIN)/mypy

# The whole suite, what CI runs (.ci/run): the Spark tests in one process (one Spark session)
# beside the rest on xdist workers (worksteal: the long integration tests would otherwise pile
# up on one worker), each worker with its own Tansu on its own ports. (Not
# --dist loadgroup: with pytest 9.2 it no longer keeps an xdist_group on one worker,
# pytest-dev/pytest-xdist#1386, and every worker would start Spark.)
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(MAKE) --no-print-directory -j2 --output-sync=target test-spark test-rest

test-spark: $(STAMP)
	$(PYTEST) -m spark

test-rest: $(STAMP)
	$(PYTEST) -n $(TEST_WORKERS) --dist worksteal -m "not spark"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The long reliability runs, outside `make test` (docs/reliability.md); short versions of each
# run in make test.

# fuzz: (tests/fuzz)

# The property tests (hypothesis) of every decoder with thousands of random examples each, where
# make check/test run 40 with a fixed seed; prints each test's example count (docs/reliability.md).
PROPERTY_TESTS := $(wildcard tests/*/test_*_properties.py)
fuzz-properties: $(STAMP)
	HYPOTHESIS_PROFILE=long $(PYTEST) -n 2 --timeout=0 --hypothesis-show-statistics $(PROPERTY_TESTS)

# faults: (broker and proxy faults under load)

# load: (10k connections, floods, slow clients)

# soak: (30 minutes, mixed workload)

# Measured and printed, never asserted: see bench/. `make bench BENCH=producer_ids` runs one.
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH)

clean:
	rm -rf $(VENV) build *.egg-info
