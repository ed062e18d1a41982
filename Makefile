# The two commands the README promises: `make demo` and `make test`; and `make check`, the tier
# to run while working (docs/development.md, "Test tiers").
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo check unit typecheck test test-spark test-rest lint bench clean fuzz fuzz-proxy

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

# fuzz: every atheris target (tests/fuzz/targets.py) for FUZZ_RUNS inputs each, seeded from the
# recorded corpus in tests/fuzz/corpus; prints inputs run, coverage and crashes per target (work
# corpus, logs and crash inputs in build/fuzz). Installs the `fuzz` extra (atheris) first.
# fuzz-proxy: mutated real sessions against a proxy in front of Tansu for FUZZ_PROXY_SECONDS,
# beside an idempotent producer whose every record must come back once and in order.
FUZZ_RUNS ?= 1000000
FUZZ_JOBS ?= 2
FUZZ_PROXY_SECONDS ?= 300

fuzz: $(STAMP)
	$(BIN)/pip install --quiet -e '.[fuzz]'
	$(BIN)/python -m tests.fuzz.run --runs $(FUZZ_RUNS) --jobs $(FUZZ_JOBS)

fuzz-proxy: $(STAMP)
	$(BIN)/python -m tests.fuzz.proxy_fuzz --seconds $(FUZZ_PROXY_SECONDS)

# faults: (broker and proxy faults under load)

# load: (10k connections, floods, slow clients)

# soak: (30 minutes, mixed workload)

# Measured and printed, never asserted: see bench/. `make bench BENCH=producer_ids` runs one.
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH)

clean:
	rm -rf $(VENV) build *.egg-info
