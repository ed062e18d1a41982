"""Cluster-wide quotas: proxy processes sharing one real Valkey (docs/cluster-quotas.md).

Two proxy processes in front of the same Tansu, each with a producer of the same client-id under
one 1 MiB/s quota: with the store the two together are held to it; the same with a consumer
each, under one consumer quota. AlterClientQuotas at one is
described at the other. Killing the store under load gives no client error, a degraded replica,
and shared counting again once it is back.

The long accuracy runs (3 and 10 replicas, 60 s, skewed and shifting traffic) are
`make bench BENCH=shared_accuracy`; here the bounds are wider, for a loaded 2-core machine.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.processes import ProxyProcess
from devkit.producing import Timeline, consume, fill
from devkit.tansu import Broker
from devkit.valkey import ValkeyServer
from tests.support.clients import (
    Progress,
    alter_quota,
    assert_no_lasting_degradation,
    describe_quotas,
    in_thread,
    run_producer,
)

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
QUOTA = MiB
WARM_UP, STEADY_END = 15.0, 35.0
RUN = STEADY_END + 1.0
SMALLER_BATCHES = {"batch.size": 128 * 1024}




def _replicas(broker: Broker, node_id: int, store: dict | None, n: int,
              quotas: list[dict] | None = None, window_num: int = 3) -> list[ProxyProcess]:
    # Three 1 s samples, as test_quota_enforcement: a new client's first burst is paid back by
    # the time the steady state is measured.
    config: dict = {"quota": {"window_num": window_num, "alter_principals": ["ANONYMOUS"]},
                    "quotas": quotas or [{"client-id": "shared-producer", "producer_byte_rate": QUOTA}]}
    if store is not None:
        # A sync may stall for hundreds of ms on a loaded 2-core machine; a killed store is
        # refused at once whatever the timeout.
        config["store"] = {"timeout_ms": 1000, **store}
    return [ProxyProcess(broker.address, node_id, extra_config=config).start() for _ in range(n)]


def _topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)


def _stop(proxies: list[ProxyProcess]) -> None:
    for p in proxies:
        p.stop()


def test_two_replicas_hold_one_producer_quota_together(broker: Broker, broker_node_id: int,
                                                       valkey: ValkeyServer, topic_name: str) -> None:
    proxies = _replicas(broker, broker_node_id, {"url": valkey.url, "key_prefix": "t1"}, 2)
    try:
        _topic(proxies[0].bootstrap, topic_name)
        runs = [Progress(), Progress()]
        threads = [in_thread(run_producer, p.bootstrap, topic_name, "shared-producer", RUN, progress,
                             config=SMALLER_BATCHES) for p, progress in zip(proxies, runs, strict=True)]
        for t in threads:
            t.join(RUN + 90)
        rates = [r.rate(WARM_UP, STEADY_END) for r in runs]
        total = sum(rates)
        print(f"replica rates {[f'{r / MiB:.3f}' for r in rates]} MiB/s, total {total / MiB:.3f} MiB/s")
        assert [r.errors for r in runs] == [[], []]
        assert 0.85 * QUOTA <= total <= 1.15 * QUOTA
        for p in proxies:
            assert p.metric("kafka_quota_proxy_store_degraded") == 0
            assert p.metric("kafka_quota_proxy_store_replicas") == 2
            assert_no_lasting_degradation(p.log_text())
    finally:
        _stop(proxies)


def test_two_replicas_hold_one_consumer_quota_together(broker: Broker, broker_node_id: int,
                                                       valkey: ValkeyServer, topic_name: str) -> None:
    # Each replica's consumer reads the partition from its start on its own; without the store the
    # two would get about twice the quota. What the quota counts is each replica's Fetch response
    # bytes, here over the whole run: Kafka allows a window's worth at once and then the quota, at
    # most Q x (run + window). A fetch is all or nothing, so the fleet takes its headroom in bursts
    # about a window apart, and 20 s of steady state held one burst or two (0.48 MiB/s in one CI
    # run, 0.69-0.76 here). Kafka's formula itself holds one consumer 8-21% under its quota
    # (docs/cluster-quotas.md), hence the wide lower bound.
    proxies = _replicas(broker, broker_node_id, {"url": valkey.url, "key_prefix": "t4"}, 2,
                        quotas=[{"client-id": "shared-consumer", "consumer_byte_rate": QUOTA}],
                        window_num=11)
    try:
        _topic(proxies[0].bootstrap, topic_name)
        fill(broker.address, topic_name, int(RUN + 10), batch_bytes=64 * 1024)

        def fetched() -> float:
            return sum(p.metric("kafka_quota_proxy_response_bytes_total", api="Fetch") for p in proxies)

        before = fetched()
        start = time.monotonic() + 0.5
        readers = [Timeline() for _ in proxies]
        threads = [in_thread(consume, p.bootstrap, topic_name, "shared-consumer", start, RUN, tl)
                   for p, tl in zip(proxies, readers, strict=True)]
        for t in threads:
            t.join(RUN + 90)
        total = fetched() - before
        allowed = QUOTA * (RUN + 11)  # one 11 s window's worth at once, then the quota
        print(f"fetched {total / MiB:.1f} MiB through two replicas in {RUN:.0f} s, "
              f"{total / allowed:.2f} of what one consumer may; read "
              f"{[tl.at(RUN) // MiB for tl in readers]} MiB")
        assert all(tl.at(RUN) > 0 for tl in readers)  # neither replica's consumer starved
        assert 0.5 * allowed <= total <= 1.1 * allowed
        for p in proxies:
            assert p.metric("kafka_quota_proxy_store_degraded") == 0
            assert_no_lasting_degradation(p.log_text())
    finally:
        _stop(proxies)


def test_a_quota_set_at_one_replica_is_described_at_the_other_within_a_second(
        broker: Broker, broker_node_id: int, valkey: ValkeyServer) -> None:
    store = {"url": valkey.url, "key_prefix": "t2"}
    a, b = _replicas(broker, broker_node_id, store, 2)
    try:
        code, message = alter_quota(a.bootstrap, [("user", "alice")], "producer_byte_rate", 4096.0)
        assert (code, message) == (0, None)
        set_at = time.monotonic()
        seen = None
        while time.monotonic() - set_at < 5:
            resp = describe_quotas(b.bootstrap, [("user", 0, "alice")])
            entries = resp.entries or []
            if entries:
                seen = time.monotonic() - set_at
                assert [(v.key, v.value) for v in entries[0].values] == [("producer_byte_rate", 4096.0)]
                break
            time.sleep(0.05)
        print(f"described at the other replica after {seen}s")
        assert seen is not None and seen < 1.0
        assert "source=store" in b.log_text() and "user=alice" in b.log_text()
    finally:
        _stop([a, b])
    # Every replica restarted: the quota is still there, from the store.
    (c,) = _replicas(broker, broker_node_id, store, 1)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            entries = describe_quotas(c.bootstrap, [("user", 0, "alice")]).entries or []
            if entries:
                break
            time.sleep(0.05)
        assert [(v.key, v.value) for v in entries[0].values] == [("producer_byte_rate", 4096.0)]
    finally:
        c.stop()


def test_the_store_killed_under_load_no_client_error_then_shared_again(
        broker: Broker, broker_node_id: int, topic_name: str) -> None:
    server = ValkeyServer().start()
    proxies = _replicas(broker, broker_node_id, {"url": server.url, "key_prefix": "t3"}, 2)
    try:
        _topic(proxies[0].bootstrap, topic_name)
        runs = [Progress(), Progress()]
        seconds = 16.0
        threads = [in_thread(run_producer, p.bootstrap, topic_name, "shared-producer", seconds, r,
                             config=SMALLER_BATCHES) for p, r in zip(proxies, runs, strict=True)]
        time.sleep(4)
        server.kill()
        killed = time.monotonic()
        degraded_after = None
        while time.monotonic() - killed < 5:
            if all(p.metric("kafka_quota_proxy_store_degraded") == 1 for p in proxies):
                degraded_after = time.monotonic() - killed
                break
            time.sleep(0.05)
        time.sleep(3)
        server.restart(empty=True)
        back = time.monotonic()
        recovered_after = None
        while time.monotonic() - back < 10:
            if all(p.metric("kafka_quota_proxy_store_degraded") == 0 for p in proxies):
                recovered_after = time.monotonic() - back
                break
            time.sleep(0.05)
        for t in threads:
            t.join(seconds + 90)
        print(f"degraded after {degraded_after}s, recovered after {recovered_after}s")
        assert degraded_after is not None and degraded_after < 2.0
        assert recovered_after is not None
        assert [r.errors for r in runs] == [[], []]
        for p in proxies:
            log = p.log_text()
            assert log.count("enforced as this replica's share") == 1
            assert "answers again" in log
            assert "Traceback" not in log
    finally:
        _stop(proxies)
        server.stop()
