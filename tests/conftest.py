from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from devkit import processes as proxy_processes
from devkit.kafka import KafkaBroker
from devkit.processes import ProxyProcess
from devkit.relay import Relay
from devkit.tansu import Broker
from devkit.valkey import ValkeyCluster, ValkeyServer

# The tiers (docs/development.md, "Test tiers"): `make check` runs what none of these marks;
# `make test` runs everything. Each module says its own marks (pytestmark); this hook is the
# net under them, so that `-m "not integration"` never starts Tansu and `-m "not spark"` never
# starts Spark, whichever module asks for those fixtures.
# The property tests' budgets (docs/reliability.md, "Fuzzing: property-based tests"). "ci", the
# default, is what `make check` and `make test` run: a fixed seed, so a run is reproducible and a
# red build is the code's doing, not the dice's; new inputs are the "long" profile's job, random
# each run and with thousands of examples: HYPOTHESIS_PROFILE=long (`make fuzz-properties`).
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
# make check's: fewer examples, the same fixed seed (make test runs "ci").
settings.register_profile("check", max_examples=15, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# a real Tansu broker (`proxy` and `broker_node_id` need it), a real Kafka 4 broker (devkit.kafka)
INTEGRATION_FIXTURES = {"broker", "kafka_broker"}
KAFKA_FIXTURES = {"kafka_broker"}  # Apache Kafka's JVM (the modules that start their own say so)
SPARK_FIXTURES = {"spark"}  # a local Spark session (`analyzed` needs it)
# A Cluster takes 2 s to form (a master waits that long before it says cluster_state:ok); a
# standalone Valkey starts in about 50 ms and needs no mark.
SLOW_FIXTURES = {"valkey_cluster", "valkey_cluster_relayed"}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report carries the log tail and exit status of every proxy process it
    started: a proxy that died or refused a connection in CI then says why."""
    report = yield
    if call.when == "setup":
        item.stash[_PROXIES_BEFORE] = len(proxy_processes.STARTED)
    elif report.failed:
        for p in proxy_processes.STARTED[item.stash.get(_PROXIES_BEFORE, 0):]:
            status = "running" if p.proc is None or p.proc.poll() is None else f"exited {p.proc.returncode}"
            try:
                tail = "".join(p.log_text().splitlines(keepends=True)[-40:])
            except (AssertionError, OSError) as exc:
                tail = f"(no log: {exc!r})"
            report.sections.append((f"proxy on port {p.port} ({status}), log tail", tail))
    return report


_PROXIES_BEFORE = pytest.StashKey[int]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        folder = item.path.relative_to(item.config.rootpath).parts[:2]
        if folder == ("tests", "integration") or fixtures & INTEGRATION_FIXTURES:
            item.add_marker(pytest.mark.integration)
        if fixtures & KAFKA_FIXTURES:
            item.add_marker(pytest.mark.kafka)
        if fixtures & SPARK_FIXTURES:
            item.add_marker(pytest.mark.spark)
            # A hang guard, not a speed test: the first test pays for the Spark session and one
            # whole analyze run, and beside make test's Kafka brokers on 2 cores that ran past the
            # suite's 300 s once (CI on c7a4e86: still drawing the report's plots at 300 s).
            item.add_marker(pytest.mark.timeout(900))
        if fixtures & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    b = Broker().start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """A real Apache Kafka 4 (one combined KRaft node, PLAINTEXT, node id 1) on a free loopback
    port: `kafka_broker.bootstrap`. The first run resolves its jars with Maven (devkit.kafka)."""
    b = KafkaBroker().start()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="session")
def broker_node_id(broker: Broker) -> int:
    return broker.node_id()


@pytest.fixture(scope="session")
def proxy(broker: Broker, broker_node_id: int) -> Iterator[ProxyProcess]:
    """One proxy shared by the tests that only need a working path to the broker."""
    p = ProxyProcess(broker.address, broker_node_id).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


# -- Valkey, for the shared quota store (devkit.valkey) ------------------------------------------

@pytest.fixture
def valkey_factory() -> Iterator[Callable[..., ValkeyServer]]:
    """Start a ValkeyServer with any of its options (`valkey_factory(unix=True, password="pw",
    persistence="aof")`); every one started is stopped at teardown."""
    started: list[ValkeyServer] = []

    def start(**options: Any) -> ValkeyServer:
        server = ValkeyServer(**options)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def valkey(valkey_factory: Callable[..., ValkeyServer]) -> ValkeyServer:
    """A fresh, empty Valkey of the test's own on a free loopback port (`valkey.url`)."""
    return valkey_factory()


@pytest.fixture
def valkey_unix(valkey_factory: Callable[..., ValkeyServer]) -> ValkeyServer:
    """A fresh Valkey listening only on a Unix socket in its own directory (`valkey_unix.url`
    is unix:///...)."""
    return valkey_factory(unix=True)


@pytest.fixture
def valkey_relay(valkey: ValkeyServer) -> Iterator[Relay]:
    """A fault relay in front of `valkey`: connect to `valkey_relay.port` (or
    redis://{valkey_relay.address}), then delay(), blackhole() or cut() the path."""
    relay = Relay(valkey.port).start()
    yield relay
    relay.stop()


@pytest.fixture(scope="module")
def valkey_cluster() -> Iterator[ValkeyCluster]:
    """A 3-master Valkey Cluster shared by a module's tests (FLUSHALL is theirs to do); a test that
    kills or pauses nodes starts its own ValkeyCluster instead."""
    cluster = ValkeyCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def valkey_cluster_relayed() -> Iterator[ValkeyCluster]:
    """A 3-master Cluster of the test's own with a relay in front of each node
    (`valkey_cluster_relayed.relays[i]`), which the nodes announce to clients."""
    cluster = ValkeyCluster(relayed=True).start()
    yield cluster
    cluster.stop()
