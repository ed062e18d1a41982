"""The sync against a real Valkey, without proxies: two replicas' quota engines, each with its
StoreSync, driven by hand. What the scripts keep and return is the store's claim tested here."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from typing import cast

import pytest

from devkit.relay import Relay
from devkit.valkey import ValkeyCluster, ValkeyServer
from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.config.store_settings import StoreSettings
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.store.sync import StoreSync
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.shared import bucket_of
from kafka_quota_proxy.quota.shared_rate import SharedRate
from kafka_quota_proxy.quota.turns import Turns
from tests.support.managers import produce_bytes, producer_id_rate

pytestmark = pytest.mark.integration




class Replica:
    def __init__(self, url: str, prefix: str, quotas: dict, clock: list[int], cluster: bool = False,
                 sample_s: int = 1) -> None:
        self.engine = QuotaEngine(QuotaSettings(scope="cluster", window_size_seconds=sample_s),
                                  QuotaStore(quotas),
                                  clock=lambda: clock[0], shared_buckets=4)
        assert self.engine.shared is not None
        settings = StoreSettings(url=url, key_prefix=prefix, timeout_ms=2000, cluster=cluster, buckets=4)
        self.sync = StoreSync(settings, self.engine.shared,
                              clock=lambda: float(clock[0]), id_rates=self.engine.shared_id_rates,
                              ids=self.engine.shared_ids)


def test_two_replicas_see_each_others_bytes_and_a_retry_never_counts_twice(valkey: ValkeyServer) -> None:
    clock = [time.monotonic_ns() // 1_000_000]  # the real clock: aligned samples follow the store's
    quotas = {QuotaEntity(client_id="app"): {QuotaKey.PRODUCER_BYTE_RATE: 1e12}}
    a, b = (Replica(valkey.url, "s1", quotas, clock) for _ in range(2))

    async def scenario() -> tuple[float, float, float]:
        for _ in range(30):
            await asyncio.sleep(0.02)
            clock[0] = time.monotonic_ns() // 1_000_000
            produce_bytes(a.engine.scope("x")).record_and_get_throttle_ms("u", "app", 30_000, clock[0])
            produce_bytes(b.engine.scope("x")).record_and_get_throttle_ms("u", "app", 10_000, clock[0])
            assert await a.sync.sync_once() and await b.sync.sync_once()
        await a.sync.sync_once()  # nothing new: the same absolute values again
        await a.sync.sync_once()
        await b.sync.sync_once()
        now = clock[0] = time.monotonic_ns() // 1_000_000
        seen_a = produce_bytes(a.engine.scope("x")).measure("u", "app", now)
        seen_b = produce_bytes(b.engine.scope("x")).measure("u", "app", now)
        total = sum(int(v) for key in valkey.command("KEYS", "{s1:b*}:t:*")
                    for v in valkey.command("HVALS", key))
        await a.sync.close()
        await b.sync.close()
        return seen_a, seen_b, total

    seen_a, seen_b, total = asyncio.run(scenario())
    assert total == 30 * 40_000
    # Both see the whole fleet's bytes over about 10 s (Kafka's (N-1) W at least): their own over
    # Kafka's window, the other's over the aligned samples' span, which differ by up to a sample.
    assert seen_a == pytest.approx(30 * 40_000 / 10, rel=0.1)
    assert seen_b == pytest.approx(30 * 40_000 / 10, rel=0.1)


def test_a_producer_id_seen_through_two_replicas_counts_once(valkey: ValkeyServer) -> None:
    clock = [5_000_000]
    quotas = {QuotaEntity(user="alice"): {QuotaKey.PRODUCER_IDS_RATE: 1000.0}}
    a, b = (Replica(valkey.url, "s2", quotas, clock) for _ in range(2))

    async def scenario() -> tuple[float, float]:
        pa = producer_id_rate(a.engine.scope("x"))
        pb = producer_id_rate(b.engine.scope("x"))
        assert pa.charge("alice", [1, 2, 3, 4], clock[0]).new_ids == 4
        assert await a.sync.sync_once()
        clock[0] += 50
        # 3 and 4 were counted at a; 5 is new everywhere.
        assert pb.charge("alice", [3, 4, 5], clock[0]).new_ids == 3
        assert await b.sync.sync_once()  # takes back 3 and 4, writes its count
        assert await a.sync.sync_once()  # reads b's count
        assert await b.sync.sync_once()
        now = clock[0] + 1
        rates = pa.measure("alice", now), pb.measure("alice", now)
        await a.sync.close()
        await b.sync.close()
        return rates

    rate_a, rate_b = asyncio.run(scenario())
    window_s = 10 * 3600  # (N-1) windows of an hour: the least a new rate is divided by
    assert rate_a == pytest.approx(5 / window_s, rel=1e-3)
    assert rate_b == pytest.approx(5 / window_s, rel=1e-3)


def test_after_the_store_restarts_empty_the_counts_are_whole_again(valkey: ValkeyServer) -> None:
    clock = [time.monotonic_ns() // 1_000_000]
    quotas = {QuotaEntity(client_id="app"): {QuotaKey.PRODUCER_BYTE_RATE: 1e12}}
    # Samples of a minute, as in the cluster test below: the bytes, stamped once, stay in the
    # window however long the restart and the syncs take (a 12 s pause after the restart made b
    # see none of them with 1 s samples).
    a, b = (Replica(valkey.url, "s3", quotas, clock, sample_s=60) for _ in range(2))

    async def scenario() -> float:
        produce_bytes(b.engine.scope("x")).record_and_get_throttle_ms("u", "app", 1, clock[0])
        for _ in range(10):
            clock[0] += 100
            produce_bytes(a.engine.scope("x")).record_and_get_throttle_ms("u", "app", 1_000, clock[0])
            await a.sync.sync_once()
            await b.sync.sync_once()
        valkey.kill()
        valkey.restart(empty=True)
        for _ in range(3):
            clock[0] += 100
            await a.sync.sync_once()
            await b.sync.sync_once()
        seen = produce_bytes(b.engine.scope("x")).sensors.get(("Produce", "", "app"), clock[0])
        await a.sync.close()
        await b.sync.close()
        assert seen is not None
        return sum(seen.others.values())  # type: ignore[attr-defined]

    assert asyncio.run(scenario()) == 10_000


def test_on_a_valkey_cluster_bytes_ids_and_quotas_are_shared(valkey_cluster: ValkeyCluster) -> None:
    """Every bucket's keys share a hash tag, so each script call lands on one node; the calls of
    one sync go to the three masters side by side."""
    from kafka_quota_proxy.proxy.quota_runtime.control import QuotaControl

    clock = [time.monotonic_ns() // 1_000_000]
    quotas = {QuotaEntity(user="alice"): {QuotaKey.PRODUCER_IDS_RATE: 1000.0},
              QuotaEntity(user=DEFAULT): {QuotaKey.PRODUCER_BYTE_RATE: 1e12}}  # a sensor per user
    # Samples of a minute: b's bytes stay in the window (11 samples) however long a loaded machine
    # takes over the syncs. With 1 s samples they aged out of it during make test on 816c2fa, and
    # a read none of them; a 4 s pause before each of a's syncs here reproduced that.
    a, b = (Replica(valkey_cluster.url, "c1", quotas, clock, cluster=True, sample_s=60) for _ in range(2))
    control_a, control_b = QuotaControl(QuotaStore(), {}, None), QuotaControl(QuotaStore(), {}, None)
    a.sync.config, b.sync.config = control_a, control_b

    async def scenario() -> tuple[int, float, float]:
        # Connected first, the bytes stamped after: they leave the store's window 10 s after their
        # stamp, and a first sync that connects to a cluster took long enough on a loaded machine
        # for a to see none of b's (CI on 8ad3a1c, load average 9).
        assert await a.sync.sync_once() and await b.sync.sync_once()
        clock[0] = time.monotonic_ns() // 1_000_000
        tenants = [f"t{i}" for i in range(40)]  # spread over the buckets, so over the masters
        for user in tenants:
            produce_bytes(a.engine.scope("x")).record_and_get_throttle_ms(user, "app", 1_000, clock[0])
            produce_bytes(b.engine.scope("x")).record_and_get_throttle_ms(user, "app", 3_000, clock[0])
        producer_id_rate(a.engine.scope("x")).charge("alice", [7, 8], clock[0])
        producer_id_rate(b.engine.scope("x")).charge("alice", [8, 9], clock[0])
        control_a.alter([([("user", "bob")], [("producer_byte_rate", 2048.0, False)])], False)
        # b writes before a first reads: a stat's first read takes every retained sample, later
        # ones only the current sample (and the one before, early in it). The clock here stands
        # still while the store's runs on, so each heartbeat moves the offset, and with it the
        # current sample, by the real time spent: with a's first read before b's write, a delay
        # of a second or two (CI on 3a5a41e, loaded; a 2.2 s sleep here reproduced it) moved a's
        # later reads past the sample of b's bytes, and a saw none.
        for _ in range(3):
            assert await b.sync.sync_once() and await a.sync.sync_once()
        now = clock[0] + 1
        seen = [cast(SharedRate, produce_bytes(a.engine.scope("x")).sensors.get(("Produce", user, ""), now))
                for user in tenants]
        others = sum(sum(stat.others.values()) for stat in seen)
        buckets = {bucket_of(stat.key, 4) for stat in seen}
        nodes = {valkey_cluster.keyslot(f"{{c1:b{b}}}") for b in buckets}
        assert len(buckets) == 4 and len(nodes) > 1
        rates = (producer_id_rate(a.engine.scope("x")).measure("alice", now),
                 producer_id_rate(b.engine.scope("x")).measure("alice", now))
        await a.sync.close()
        await b.sync.close()
        return others, *rates

    others, ids_a, ids_b = asyncio.run(scenario())
    assert others == 40 * 3_000  # a sees b's bytes
    assert ids_a == pytest.approx(3 / (10 * 3600), rel=1e-3)  # 7, 8, 9: 8 counted once
    assert ids_b == pytest.approx(3 / (10 * 3600), rel=1e-3)
    assert control_b.effective().get(QuotaEntity(user="bob")) == {QuotaKey.PRODUCER_BYTE_RATE: 2048.0}


def test_one_cancel_ends_the_sync_task_wherever_it_lands(valkey: ValkeyServer) -> None:
    # The shutdown cancels the sync task once. With redis-py's socket_timeout, its sends went
    # through Python 3.11's asyncio.wait_for, which drops a cancel that lands as the send
    # completes: the task synced on, and a worker never stopped (CI).
    clock = [time.monotonic_ns() // 1_000_000]
    quotas = {QuotaEntity(client_id="app"): {QuotaKey.PRODUCER_BYTE_RATE: 1e12}}
    replica = Replica(valkey.url, "s-cancel", quotas, clock)
    replica.sync.settings = dataclasses.replace(replica.sync.settings, sync_interval_ms=1)

    async def scenario() -> list[int]:
        survived = []
        for i in range(400):
            clock[0] = time.monotonic_ns() // 1_000_000
            produce_bytes(replica.engine.scope("x")).record_and_get_throttle_ms("u", "app", 1000, clock[0])
            task = asyncio.create_task(replica.sync.run_forever())
            for _ in range(i % 7):  # land the cancel at a different step of the sync each time
                await asyncio.sleep(0)
            await asyncio.sleep((i % 13) / 10_000)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2)
            if not done:
                survived.append(i)
                task.cancel()
                await asyncio.wait({task}, timeout=2)
        await replica.sync.close()
        return survived

    assert asyncio.run(scenario()) == []


def _monotonic_replica(url: str, prefix: str, **settings: object) -> tuple[StoreSync, QuotaEngine]:
    engine = QuotaEngine(QuotaSettings(scope="cluster"), QuotaStore({}), shared_buckets=4)
    assert engine.shared is not None
    store = StoreSettings(url=url, key_prefix=prefix, buckets=4, **settings)  # type: ignore[arg-type]
    return StoreSync(store, engine.shared), engine


def test_a_store_that_stops_answering_degrades_the_replica_in_two_intervals_not_two_timeouts(
        valkey_relay: Relay) -> None:
    # A partitioned (or SIGSTOPped) store answers nothing: each sync fails only at timeout_ms.
    # Waiting for two of those left the replicas on stale counts for a second; the watchdog
    # degrades after 2 intervals plus twice the usual sync's duration instead.
    sync, engine = _monotonic_replica(f"redis://{valkey_relay.address}", "s-stall",
                                      sync_interval_ms=100, timeout_ms=3000)

    async def scenario() -> tuple[float | None, float, bool]:
        task = asyncio.create_task(sync.run_forever())
        await asyncio.sleep(1.0)
        healthy = not sync.stats.degraded and sync.stats.syncs >= 5
        stale_after = sync.stale_after_ms()
        valkey_relay.blackhole(4.0)
        cut = time.monotonic()
        degraded_after = None
        while time.monotonic() - cut < 2.5:
            if sync.stats.degraded:
                degraded_after = time.monotonic() - cut
                break
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sync.close()
        return degraded_after, stale_after, healthy

    degraded_after, stale_after, healthy = asyncio.run(scenario())
    assert healthy
    assert 200 <= stale_after < 400  # 2 x 100 ms, plus twice a loopback sync's few ms
    assert engine.shared is not None and engine.shared.degraded_since is not None
    # The last success was at most an interval before the cut; no sync had failed yet (3 s timeout).
    assert degraded_after is not None and degraded_after < 0.6
    assert sync.stats.errors == 0


def test_a_slow_store_does_not_trip_the_watchdog(valkey_relay: Relay) -> None:
    # 150 ms each way: every sync takes longer than two intervals, yet the replica is not
    # degraded, because the watchdog allows twice the usual sync's duration. And a sync with
    # nothing but counts to share is one round trip (heartbeat, quotas' version and buckets in
    # one pipeline, without redis-py's SCRIPT EXISTS first): 300 ms, not 600 or more.
    sync, _ = _monotonic_replica(f"redis://{valkey_relay.address}", "s-slow",
                                 sync_interval_ms=100, timeout_ms=5000)
    valkey_relay.delay(0.15)

    async def scenario() -> tuple[int, bool]:
        task = asyncio.create_task(sync.run_forever())
        ever = False
        for _ in range(300):  # 6 s
            await asyncio.sleep(0.02)
            ever = ever or sync.stats.degraded
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sync.close()
        return sync.stats.syncs, ever

    syncs, ever_degraded = asyncio.run(scenario())
    assert syncs >= 3
    assert min(sync._recent_ms) > 200  # the premise: each sync took longer than two intervals
    assert statistics.median(sync._recent_ms) < 450
    assert not ever_degraded


def _turns(replica: Replica) -> Turns:
    turns = replica.engine.shared.turns if replica.engine.shared is not None else None
    assert turns is not None  # a sync keeps turns on the store
    return turns


def test_replicas_take_turns_in_the_order_they_asked(valkey: ValkeyServer) -> None:
    """The paced quotas' queue (scripts.TAKE_TURNS, quota/turns.py): the first to ask heads it;
    one giving its turn up goes to the back; a replica that stops asking (dead) leaves it."""
    clock = [time.monotonic_ns() // 1_000_000]
    quotas = {QuotaEntity(client_id="app"): {QuotaKey.CONSUMER_BYTE_RATE: 1000.0}}
    a, b, c = (Replica(valkey.url, "s9", quotas, clock) for _ in range(3))
    key = "consume|cluster|app"
    later = clock[0] + 60_000  # the clients wait for a minute: no claim lapses here

    async def scenario() -> list[tuple[set[str], set[str]]]:
        seen = []
        for r in (a, b, c):  # connected first (see the cluster test below)
            assert await r.sync.sync_once()
        for r in (a, b, c):  # each asks in turn, synced in that order
            _turns(r).wait(key, later)
            assert await r.sync.sync_once()
        for r in (a, b, c):
            assert await r.sync.sync_once()
        seen += [(set(_turns(r).heads), set(_turns(r).crowded)) for r in (a, b, c)]
        _turns(a).leave(key)  # a's turn is over; its client still waits: at the back
        _turns(a).wait(key, later)
        for r in (a, b, c, a):
            assert await r.sync.sync_once()
        seen += [(set(_turns(r).heads), set(_turns(r).crowded)) for r in (a, b, c)]
        # b dies: after twice the sync's staleness its claim is dropped, and c's heads the queue.
        until = time.monotonic() + 2 * b.sync.stale_after_ms() / 1000 + 0.1
        while time.monotonic() < until:  # a and c go on syncing
            for r in (a, c):
                assert await r.sync.sync_once()
            await asyncio.sleep(0.1)
        for r in (a, c):
            assert await r.sync.sync_once()
        seen += [(set(_turns(r).heads), set(_turns(r).crowded)) for r in (a, c)]
        for r in (a, b, c):
            await r.sync.close()
        return seen

    seen = asyncio.run(scenario())
    one = {key}
    assert seen[:3] == [(one, one), (set(), one), (set(), one)]
    assert seen[3:6] == [(set(), one), (one, one), (set(), one)]
    assert seen[6:] == [(set(), one), (one, one)]
    queue = valkey.command("HKEYS", f"{{s9:b{bucket_of(key, 4)}}}:q:{key}")
    members = sorted(r.decode() if isinstance(r, bytes) else r for r in queue)
    assert members == sorted([a.sync.replica, c.sync.replica])


def test_a_replica_alone_in_the_queue_heads_it_and_is_not_crowded(valkey: ValkeyServer) -> None:
    clock = [time.monotonic_ns() // 1_000_000]
    quotas = {QuotaEntity(client_id="app"): {QuotaKey.CONSUMER_BYTE_RATE: 1000.0}}
    a = Replica(valkey.url, "s10", quotas, clock)

    async def scenario() -> tuple[set[str], set[str], set[str]]:
        _turns(a).wait("k", clock[0] + 60_000)
        assert await a.sync.sync_once()
        heads, crowded = set(_turns(a).heads), set(_turns(a).crowded)
        _turns(a).leave("k")  # given up, not asked again: off the queue
        assert await a.sync.sync_once()
        await a.sync.close()
        return heads, crowded, _turns(a).heads

    heads, crowded, after = asyncio.run(scenario())
    assert (heads, crowded, after) == ({"k"}, set(), set())
    assert valkey.command("EXISTS", f"{{s10:b{bucket_of('k', 4)}}}:q:k") in (0, b"0")


def test_on_a_valkey_cluster_each_buckets_queues_are_one_call_to_one_node(
        valkey_cluster: ValkeyCluster) -> None:
    clock = [time.monotonic_ns() // 1_000_000]
    quotas = {QuotaEntity(client_id="app"): {QuotaKey.CONSUMER_BYTE_RATE: 1000.0}}
    a, b = (Replica(valkey_cluster.url, "c9", quotas, clock, cluster=True) for _ in range(2))
    keys = [f"k{i}" for i in range(12)]  # spread over the buckets, so over the masters
    assert len({bucket_of(k, 4) for k in keys}) == 4

    async def scenario() -> tuple[set[str], set[str], set[str]]:
        # Connected first: a first sync that connects to a cluster may outlast a claim's life
        # (twice the sync's staleness limit) on a loaded machine, and a's claims would be gone.
        assert await a.sync.sync_once() and await b.sync.sync_once()
        for k in keys:
            _turns(a).wait(k, clock[0] + 60_000)
        assert await a.sync.sync_once()
        for k in keys[:6]:
            _turns(b).wait(k, clock[0] + 60_000)
        assert await b.sync.sync_once() and await a.sync.sync_once()
        out = set(_turns(a).heads), set(_turns(a).crowded), set(_turns(b).heads)
        await a.sync.close()
        await b.sync.close()
        return out

    heads_a, crowded_a, heads_b = asyncio.run(scenario())
    assert (heads_a, crowded_a, heads_b) == (set(keys), set(keys[:6]), set())
