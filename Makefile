# The two commands the README promises: `make demo` and `make test`; and `make check`, the tier
# to run while working (docs/development.md, "Test tiers").
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: containers compose-demo demo demo-stress demo-replicas check unit typecheck test test-spark test-rest test-kafka lint bench clean faults faults-broker faults-proxy \
        load fuzz fuzz-proxy fuzz-properties

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

# Starts an embedded Tansu broker and the proxy, runs two producers (one held to a quota, one
# free) and a consumer through it with a live view, and stops by itself (or on Ctrl-C), leaving
# nothing running.
# BROKER=kafka: the same demo in front of Apache Kafka 4.4 from Maven Central's jars (devkit.kafka).
BROKER ?= tansu
demo: $(STAMP)
	$(BIN)/python -m devkit.demo --broker $(BROKER)

# The demo again and again, cold (fresh processes, the page cache dropped where allowed) and with
# busy loops beside it, counting mismatches by cause (docs/reliability.md, "The demo under load").
DEMO_RUNS ?= 50
DEMO_HOGS ?= 2,3
demo-stress: $(STAMP)
	$(BIN)/python -m devkit.demo.stress --runs $(DEMO_RUNS) --hogs $(DEMO_HOGS) --broker $(BROKER)

# Cluster-wide quotas, the problem and the fix: 2 proxy replicas without and with a shared Valkey.
demo-replicas: $(STAMP)
	$(BIN)/python -m devkit.demo --replicas 2

# The image built from the Dockerfile with podman and run for real: --help, check-config of every
# shipped config, then as deploy/kubernetes/sidecar.yaml runs it in front of Tansu (probes, ports,
# user, produce and consume, a quota held, SIGTERM). Installs podman if missing (root) and builds
# the local stand-in base images once (no image registry is reachable here); about 3 minutes the
# first time, 1 after. docs/deployment.md, "Containers". .ci/run runs it after make test.
containers: $(STAMP)
	bash devkit/containers/setup.sh
	bash devkit/containers/bases.sh
	$(BIN)/python -m devkit.containers.image --no-cache

# docker-compose.yml up for real (podman behind Debian's docker-compose), with local stand-ins for
# the images that cannot be pulled (deploy/compose/standins.yml): two replicas hold one quota
# through Valkey, Prometheus scrapes both, then down. About 2 minutes after make containers.
compose-demo: $(STAMP)
	bash devkit/containers/setup.sh
	bash devkit/containers/bases.sh
	$(BIN)/python -m devkit.containers.compose_demo

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
	HYPOTHESIS_PROFILE=check $(PYTEST) -n 2 -m "$(FAST)"

typecheck: $(STAMP)
	$(BIN)/mypy

# The whole suite, what CI runs (.ci/run): the rest on xdist workers (worksteal: the long
# integration tests would otherwise pile up on one worker), each worker with its own Tansu on its
# own ports; then the Spark tests in one process (one Spark session); then Kafka's. (Not
# --dist loadgroup: with pytest 9.2 it no longer keeps an xdist_group on one worker,
# pytest-dev/pytest-xdist#1386, and every worker would start Spark.) One phase after the other:
# with Spark beside the rest on 2 cores (load average 9, CI on 8ad3a1c) a shared-store sync ran
# past its test's window and a replica refused a connection; about 6 minutes longer in all.
# Kafka's jars are resolved first, once (a failed resolve stops here with Maven's words), not by
# whichever test first asks for them inside a phase.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m devkit.kafka resolve
	$(MAKE) --no-print-directory test-rest
	$(MAKE) --no-print-directory test-spark
	$(MAKE) --no-print-directory test-kafka

test-spark: $(STAMP)
	$(PYTEST) -m spark

test-rest: $(STAMP)
	$(PYTEST) -n $(TEST_WORKERS) --dist worksteal -m "not spark and not kafka"

# Apache Kafka's tests (marker kafka), after the rest: their JVMs (512 MB heap each, a three-broker
# cluster among them) beside the timing-sensitive tests on 2 cores starved those (CI on 66862cb:
# store syncs timed out, a proxy took over 20 s to listen, a share consumer's measured rate sagged).
# One at a time: about 13 minutes.
test-kafka: $(STAMP)
	$(PYTEST) -m "kafka and not spark"

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

# The property tests (hypothesis) of every decoder with thousands of random examples each, where
# make check/test run 40 with a fixed seed; prints each test's example count (docs/reliability.md).
PROPERTY_TESTS := $(wildcard tests/*/test_*_properties.py)
fuzz-properties: $(STAMP)
	HYPOTHESIS_PROFILE=long $(PYTEST) -n 2 --timeout=0 --hypothesis-show-statistics $(PROPERTY_TESTS)

# Broker and proxy faults under load (docs/reliability.md), one after the other: about 35 min.
faults: faults-broker faults-proxy

# Broker faults under load through the proxy, each fault 3 times on Tansu storing in S3, plus a
# kill -9 straight to Tansu as the control; prints the table of docs/reliability.md (~23 min).
faults-broker: $(STAMP)
	$(BIN)/python -m devkit.broker_faults --repeat 3 --direct

# SIGTERM and kill -9 of the proxy under load, and its files killed mid-write; prints the table
# of docs/reliability.md ("Proxy faults"), exit status 1 if anything was lost. About 10 minutes.
faults-proxy: $(STAMP)
	$(BIN)/python -m devkit.proxy_faults

# 10,000 connections held through a proxy with --workers 2 (each worker under its own
# descriptor limit), a flood of 2,000 new connections/s from 2 processes against the connection
# quotas, slow and non-reading clients; printed as JSON lines, about 5 minutes
# (docs/reliability.md, "Load and hostile clients").
load: $(STAMP)
	$(BIN)/python -m bench.connections all

# A mixed workload through one proxy process in front of Tansu for SOAK_MINUTES, sampled every
# 5 s, then judged: memory flat within 5% after warm-up, no descriptor growth, no ERROR in the
# proxy's log, every acknowledged record read back. Writes samples.csv, soak.png, report.txt and
# the logs to SOAK_OUT. A 60 s version runs in make test (tests/integration/test_soak.py).
SOAK_MINUTES ?= 30
SOAK_OUT ?= soak-out
.PHONY: soak
soak: $(STAMP)
	$(BIN)/python -m devkit.soak --minutes $(SOAK_MINUTES) --out $(SOAK_OUT)

# Measured and printed, never asserted: see bench/. `make bench BENCH=producer_ids` runs one.
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH)

clean:
	rm -rf $(VENV) build *.egg-info
