"""What the producer-id quota (KIP-936) costs: per Produce request, and in memory per user.

Per request, timed on the proxy's own code with the clock it uses (perf_counter), best of five
rounds so that a scheduler hiccup does not count:
- reading the producer ids out of the record batch headers (protocol.produce.producer_ids);
- the manager's charge for an id already seen (the steady case) and for a new one;
- the stages that charge a Produce request (ProducerIdCharge, then QuotaCharge), with
  producer_ids_rate configured and without it: the difference is what the quota adds to every
  Produce.

Memory per user: the Bloom filter bits (the cache's own count) and everything Python holds for
the user (tracemalloc), with the default filter shape (1,000 ids per window at 1%), for users
that each bring 1,000 ids.
"""

from __future__ import annotations

import time
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

from kafka.protocol.producer.produce import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from kafka_quota_proxy.protocol.produce import producer_ids
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.producer_ids import ProducerIdCharge
from kafka_quota_proxy.proxy.stages.quota_charge import QuotaCharge
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.producer_ids import ProducerIdCache, ProducerIdQuotaManager
from kafka_quota_proxy.quota.resolution import QuotaStore

ROUNDS = 5
CALLS = 20_000
USERS = 1_000
IDS_PER_USER = 1_000


def _batch(pid: int, records: int = 10) -> bytes:
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1_000_000)
    b.set_producer_state(pid, 0, 0, False)
    for i in range(records):
        b.append(timestamp=None, key=None, value=b"v" * 100 + b"%d" % i, headers=[])
    b.close()
    return bytes(b.buffer())


def produce_frame(pid: int, partitions: int) -> memoryview:
    """A Produce v9 request: one batch of ten 100-byte records per partition, all from `pid`."""
    t = ProduceRequest.TopicProduceData
    req = ProduceRequest(version=9, transactional_id=None, acks=1, timeout_ms=30_000, topic_data=[
        t(name="orders", topic_id=uuid.UUID(int=1), partition_data=[
            t.PartitionProduceData(index=p, records=_batch(pid)) for p in range(partitions)])])
    return memoryview(frame_request(req, 9, 1, "bench"))


def best_ns(fn: Callable[[], Any], calls: int = CALLS) -> float:
    """Nanoseconds per call, the best of ROUNDS rounds."""
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e9)
    return best


Stage = Callable[[RequestContext], object]


def _stage(with_quota: bool) -> tuple[Stage, Callable[[memoryview], RequestContext]]:
    quotas = {QuotaEntity(client_id="other"): {QuotaKey.PRODUCER_BYTE_RATE: 1e12}}
    if with_quota:
        quotas[QuotaEntity(user=DEFAULT)] = {QuotaKey.PRODUCER_IDS_RATE: 1e6}
    engine = QuotaEngine(QuotaSettings(), QuotaStore(quotas), clock=lambda: 1_000_000)
    ids, charge = ProducerIdCharge(engine), QuotaCharge(engine)

    def stage(ctx: RequestContext) -> object:
        return ids.on_request(ctx) or charge.on_request(ctx)
    info = ConnectionInfo("127.0.0.1", "bench")
    info.principal = "alice"
    info.upstream = "127.0.0.1:9092"
    info.quotas = engine.scope(info.upstream)

    def context(frame: memoryview) -> RequestContext:
        ctx = RequestContext(parse_request_header(frame), frame, info)
        ctx.acks = 1
        return ctx
    return stage, context


def per_request() -> list[tuple[str, float]]:
    rows = []
    for partitions in (1, 10):
        frame = produce_frame(7, partitions)
        at = parse_request_header(frame).body_offset
        rows.append((f"read producer ids, {partitions} partition(s)", _read_ns(frame, at)))
    cache_engine = QuotaEngine(QuotaSettings(), QuotaStore({QuotaEntity(user=DEFAULT): {
        QuotaKey.PRODUCER_IDS_RATE: 1e6}}), clock=lambda: 1_000_000)
    manager = cache_engine.scope("b").of(QuotaKey.PRODUCER_IDS_RATE, ProducerIdQuotaManager)
    manager.charge("alice", [7], 1_000_000)
    rows.append(("charge a seen id", best_ns(lambda: manager.charge("alice", [7], 1_000_000))))
    fresh = iter(range(10**12))
    rows.append(("charge a new id", best_ns(lambda: manager.charge("alice", [next(fresh)], 1_000_000),
                                             calls=2_000)))
    frame = produce_frame(7, 1)
    for with_quota in (False, True):
        label = "Charging stages on a Produce, " + ("producer_ids_rate set" if with_quota else "without it")
        rows.append((label, _stage_ns(with_quota, frame)))
    return rows


def _read_ns(frame: memoryview, at: int) -> float:
    return best_ns(lambda: producer_ids(frame, at, 9))


def _stage_ns(with_quota: bool, frame: memoryview) -> float:
    stage, context = _stage(with_quota)
    stage(context(frame))
    return best_ns(lambda: stage(context(frame)))


def memory_per_user() -> tuple[float, float]:
    """(filter bytes per user, bytes traced per user) for USERS users of IDS_PER_USER ids."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache = ProducerIdCache()
    pid = 0
    for u in range(USERS):
        user = f"user-{u}"
        for _ in range(IDS_PER_USER):
            cache.track(user, pid, 0)
            pid += 1
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return cache.memory_bytes() / USERS, traced / USERS


def run() -> list[tuple[str, str]]:
    rows = [(name, f"{ns / 1000:.2f} µs") for name, ns in per_request()]
    bits, traced = memory_per_user()
    rows.append((f"memory per user ({IDS_PER_USER} ids, default filter): bits", f"{bits:,.0f} B"))
    rows.append((f"memory per user ({IDS_PER_USER} ids, default filter): all Python", f"{traced:,.0f} B"))
    return rows
