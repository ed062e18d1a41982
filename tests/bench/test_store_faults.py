"""A short run of bench.store_faults against a real Tansu and Valkey: with the store killed
under load no producer sees an error, every replica degrades and shares again after the
restart, and the report has its rows. The numbers are `make bench`'s."""

from __future__ import annotations

import pytest

from bench import store_faults
from devkit.tansu import Broker

pytestmark = pytest.mark.integration


def test_a_killed_store_degrades_every_replica_and_no_producer_sees_an_error(
        broker: Broker, broker_node_id: int) -> None:
    o = store_faults.run_fault(broker, broker_node_id, "kill", healthy=6.0, faulted=4.0, after=3.0,
                               replicas=2)
    assert o.errors == 0
    assert o.degraded_after is not None and o.degraded_after < 2.0
    assert o.shared_after is not None and o.shared_after < 5.0
    # Bytes moved; not necessarily in each phase: a new client's first burst (a window's worth)
    # can be paid back by a throttle that fills the whole short healthy phase.
    assert o.before + o.during + o.first_window + o.second_window > 0
    assert [name for name, _ in store_faults.rows(o)][:3] == [
        "kill: delivery errors", "kill: every replica degraded after",
        "kill: every replica shared again after"]
