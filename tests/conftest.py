from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from devkit.processes import ProxyProcess
from devkit.tansu import Broker


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
