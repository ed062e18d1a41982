"""A tiny run of bench.shared_accuracy for each kind: 2 replicas on one Valkey move bytes under
the shared quota with no delivery error. The accuracy itself is `make bench`'s
(docs/cluster-quotas.md); degradation is tested against real store faults in
tests/integration/test_store_sync.py.

On a loaded machine a sync may fail now and then, and the watchdog may then take a replica for
degraded for a moment: CI on 52ddd78 saw one failed sync in this test's 4 s, and CI on 0c865e3
one failed sync and one degradation, both with Spark's tests running beside it and no delivery
error. CI on c7a4e86, with Kafka brokers of make test, Spark and a share-group run beside it,
saw 5 failed syncs and 2 degradations (produce) and 3 and 3 (consume), again with no delivery
error. The next sync carries the same absolute counts, so nothing is counted twice; up to a fifth
of the run's 40 syncs are let through here. A store that keeps failing fails nearly all of them,
which this still catches."""

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
    assert r.errors == 0
    assert r.store_errors <= 8 and r.degradations <= 3
    # What the replicas saw is read from their metrics: their requests of the kind, and syncs.
    assert r.seen["requests"] > 0 and r.seen["syncs"] > 0
    # Producers are also measured by what the replicas read (what the quota charged).
    if kind == "produce":
        assert r.read_rate is not None and r.read_rate > 0
    else:
        assert r.read_rate is None


def test_one_replica_of_two_workers_paces_two_clients(broker: Broker, broker_node_id: int,
                                                      valkey: ValkeyServer) -> None:
    # The options issue 27's fleet runs use: two clients through one replica of two workers,
    # paced. Bytes move, with no delivery error (the accuracy is make bench's).
    r = run_shape(broker, broker_node_id, valkey, 1, "even", seconds=4.0, warm_up=0.0,
                  clients=2, quota={"byte_rate_enforcement": "paced"}, workers=2)
    assert r.clients == 2
    assert r.rate > 0
    assert r.errors == 0
