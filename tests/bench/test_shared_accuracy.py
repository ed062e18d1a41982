"""A tiny run of bench.shared_accuracy for each kind: 2 replicas on one Valkey move bytes under
the shared quota with no delivery error and no failed sync. The accuracy itself is `make bench`'s
(docs/cluster-quotas.md)."""

from __future__ import annotations

import pytest

from bench.shared_accuracy import run_shape
from devkit.tansu import Broker
from devkit.valkey import ValkeyServer

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", ["produce", "consume"])
def test_two_replicas_move_bytes_under_the_shared_quota(broker: Broker, broker_node_id: int,
                                                        valkey: ValkeyServer, kind: str) -> None:
    # From the start: a new client's first burst, then the throttle it earns, may fill seconds.
    r = run_shape(broker, broker_node_id, valkey, 2, "even", seconds=4.0, warm_up=0.0, kind=kind)
    assert r.rate > 0
    assert r.errors == 0 and r.store_errors == 0 and r.degradations == 0
