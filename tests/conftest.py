from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from devkit.processes import ProxyProcess
from devkit.tansu import Broker

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

INTEGRATION_FIXTURES = {"broker"}  # a real Tansu broker (`proxy` and `broker_node_id` need it)
SPARK_FIXTURES = {"spark"}  # a local Spark session (`analyzed` needs it)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        folder = item.path.relative_to(item.config.rootpath).parts[:2]
        if folder == ("tests", "integration") or fixtures & INTEGRATION_FIXTURES:
            item.add_marker(pytest.mark.integration)
        if fixtures & SPARK_FIXTURES:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    b = Broker().start()
    try:
        yield b
    finally:
        b.stop()


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
