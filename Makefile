# The two commands the README promises: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

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

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# Measured and printed, never asserted: see bench/. `make bench BENCH=producer_ids` runs one.
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH)

clean:
	rm -rf $(VENV) build *.egg-info
