"""The short version of `make fuzz-proxy`: mutated real sessions against a proxy in front of
Tansu for ~25 s while an idempotent producer on the same proxy sends a numbered sequence.
Nothing lost, nothing reordered, the proxy alive and answering, no traceback in its log."""

from __future__ import annotations

import pytest

from devkit.tansu import Broker
from tests.fuzz.proxy_fuzz import fuzz_proxy

pytestmark = pytest.mark.integration


def test_fuzzed_sessions_beside_an_idempotent_producer() -> None:
    # A Tansu of its own: the requests the proxy forwards are fuzzed, and one killed Tansu before
    # the proxy refused it (docs/reliability.md); the session's shared broker must not go with it.
    broker = Broker().start()
    try:
        report = fuzz_proxy(broker, broker.node_id(), seconds=25, senders=2)
    finally:
        broker.stop()
    print(report.summary())
    assert report.proxy_alive and report.crash_lines == []
    # Tansu's death fails the test too: it was an xfail until the proxy refused the CreateTopics
    # that killed it (WellFormed, CreateTopicsLimit); another death is another request to refuse.
    assert report.problems() == []
    assert report.delivery.count > 0 and report.tally.sessions > 50
    # The fuzz reached the decoders: bad input was refused, as protocol errors of several kinds.
    assert sum(report.errors_by_kind.values()) > 0 and len(report.errors_by_kind) >= 3
