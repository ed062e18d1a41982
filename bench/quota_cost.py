"""What quota accounting adds to a request, timed on the proxy's own stage code.

The throughput benchmark's `tenants` workload compares quotas on and off end to end, but on a
2-core machine where the broker takes most of the CPU its ratio moves with whatever else runs
(0.78 to 1.12 between runs of the same code). This one times what the quotas add, in-process and
with nothing else in the way: the stages a Produce request and a Fetch response pass through,
with no quota ever configured (the proxy skips its managers then) and with 100 tenants'
client-id quotas, as in `tenants`. Best of five rounds, on the clock the proxy uses.

Set against the proxy's whole CPU per request, which the throughput report prints for the same
load, the difference is what quotas cost a proxy that is the bottleneck.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.producer.produce import ProduceRequest

from bench.producer_ids import best_ns
from bench.wire import FETCH_VERSION, PRODUCE_VERSION, fetch_frame, produce_frame, record_batch
from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.producer_ids import ProducerIdCharge
from kafka_quota_proxy.proxy.stages.quota_charge import QuotaCharge
from kafka_quota_proxy.proxy.stages.quota_settle import QuotaSettle
from kafka_quota_proxy.proxy.stages.throttle_merge import ThrottleMerge
from kafka_quota_proxy.proxy.stages.topic_usage import FetchTopicBytes, ProduceTopicBytes
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.topics import Leadership

TENANTS = 100
QUOTA = 1e12  # configured and measured, never reached: the cost of accounting, not of throttling
CALLS = 20_000

# The head of a Fetch v12 response (bench.wire's version) as a broker starts it: throttle_time_ms,
# error_code, session_id, then the topics, a compact array (not read here). Its size stands for a
# 1 MiB response.
FETCH_HEAD = struct.pack(">ihi", 0, 0, 0) + b"\x01"
FETCH_BODY_SIZE = 1 << 20


def _engine(key: QuotaKey | None, shared: bool = False) -> QuotaEngine:
    """`shared`: measured as with a `store:` (quota/shared.py), the others' counts in place as
    a sync leaves them; the sync itself runs beside the request path, not on it."""
    quotas = {} if key is None else {QuotaEntity(client_id=f"tenant-{i:03d}"): {key: QUOTA}
                                     for i in range(TENANTS)}
    return QuotaEngine(QuotaSettings(), QuotaStore(quotas), shared_buckets=16 if shared else None)


UPSTREAM = "127.0.0.1:9092"


def _contexts(frames: list[bytes], engine: QuotaEngine | None = None) -> list[RequestContext]:
    """One context per frame, each on its own connection, as in `tenants` (a connection per
    tenant): a connection keeps its way to its sensor between requests, and found its scope's
    managers in `engine` when it connected (`ConnectionInfo.quotas`)."""
    quotas = engine.scope(UPSTREAM) if engine is not None else None
    return [RequestContext(parse_request_header(memoryview(f)), memoryview(f),
                           ConnectionInfo(f"127.0.0.1:{40000 + i}", "node-1", upstream=UPSTREAM,
                                          quotas=quotas))
            for i, f in enumerate(frames)]


def produce_ns(key: QuotaKey | None, shared: bool = False) -> float:
    """One Produce request through the request stages that charge it (producer ids, then
    bytes), and the response stages' checks of whether they have anything to do, from each
    tenant in turn."""
    engine = _engine(key, shared)
    ids, charge = ProducerIdCharge(engine), QuotaCharge(engine)
    settle, merge = QuotaSettle(engine), ThrottleMerge()
    batch = record_batch(1, 1024)
    ctxs = _contexts([produce_frame("bench", 0, batch, f"tenant-{i:03d}") for i in range(TENANTS)], engine)
    turn = iter(range(10**12))

    def one() -> None:
        ctx = ctxs[next(turn) % TENANTS]
        ctx.charged, ctx.throttle_ms = None, 0
        ids.on_request(ctx)
        charge.on_request(ctx)
        settle.wants(ctx)
        merge.wants(ctx)
    return best_ns(one, CALLS)


def fetch_ns(key: QuotaKey | None, shared: bool = False) -> float:
    """One Fetch: the request stage (which caps max_bytes) and the settle stage charging a 1 MiB
    response from its head, as a streamed response is charged."""
    engine = _engine(key, shared)
    charge, settle = QuotaCharge(engine), QuotaSettle(engine)
    ctxs = _contexts([fetch_frame("bench", 0, 0, 1 << 20, f"tenant-{i:03d}") for i in range(TENANTS)], engine)
    assert FETCH_VERSION == 12, "FETCH_HEAD is laid out for Fetch v12"
    head = memoryview(FETCH_HEAD)
    turn = iter(range(10**12))

    def one() -> None:
        ctx = ctxs[next(turn) % TENANTS]
        ctx.charged, ctx.throttle_ms, ctx.rewrite = None, 0, None
        charge.on_request(ctx)
        if settle.wants(ctx):
            settle.on_head(ctx, head, FETCH_BODY_SIZE)
    return best_ns(one, CALLS)


def _produce_of(partitions: int, batch: bytes) -> bytes:
    t = ProduceRequest.TopicProduceData
    req = ProduceRequest(transactional_id=None, acks=1, timeout_ms=30_000, topic_data=[
        t(name="bench", partition_data=[t.PartitionProduceData(index=p, records=batch)
                                        for p in range(partitions)])])
    return frame_request(req, PRODUCE_VERSION, 0, "tenant-000")


def _fetch_body_of(partitions: int, batch: bytes) -> bytes:
    t = FetchResponse.FetchableTopicResponse
    part = t.PartitionData
    data = [part(partition_index=p, error_code=0, high_watermark=100, last_stable_offset=100,
                 log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=batch)
            for p in range(partitions)]
    return bytes(FetchResponse(version=FETCH_VERSION, throttle_time_ms=0, error_code=0, session_id=0,
                               responses=[t(topic="bench", partitions=data)]).encode(version=FETCH_VERSION))


def topic_usage_calls(partitions: int) -> tuple[Callable[[], None], Callable[[], None], list[RequestContext]]:
    """usage_log.topics without topic quotas: one Produce request's and one Fetch response's
    bytes per topic found by the usage stages (topic_usage.py), `partitions` partitions of one
    16 KiB batch each; and the two contexts they count into."""
    leadership = Leadership()
    batch = record_batch(16, 1024)
    produce_stage, fetch_stage = ProduceTopicBytes(leadership), FetchTopicBytes(leadership)
    (produce,) = _contexts([_produce_of(partitions, batch)])
    (fetch,) = _contexts([fetch_frame("bench", 0, 0, 1 << 20, "tenant-000")])
    body = memoryview(_fetch_body_of(partitions, batch))

    def one_produce() -> None:
        produce.topic_bytes = None
        produce_stage.on_request(produce)

    def one_fetch() -> None:
        fetch.topic_bytes = None
        fetch_stage.on_response(fetch, body)
    return one_produce, one_fetch, [produce, fetch]


def topic_usage_ns(partitions: int) -> tuple[float, float]:
    """The two walks, timed. (The larger cost to a Fetch is not timed here: with usage_log.topics
    its response is gathered whole rather than written on as it arrives.)"""
    one_produce, one_fetch, _ = topic_usage_calls(partitions)
    return best_ns(one_produce, CALLS), best_ns(one_fetch, CALLS)


def run() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for name, timed, key in (("Produce", produce_ns, QuotaKey.PRODUCER_BYTE_RATE),
                             ("Fetch", fetch_ns, QuotaKey.CONSUMER_BYTE_RATE)):
        off, on, shared = timed(None), timed(key), timed(key, True)
        rows += [(f"{name}: quota stages, no quota configured", f"{off / 1000:.2f} µs"),
                 (f"{name}: quota stages, {TENANTS} tenants' {key.value}", f"{on / 1000:.2f} µs"),
                 (f"{name}: added by the quotas", f"{(on - off) / 1000:.2f} µs"),
                 (f"{name}: the same quotas shared through a store", f"{shared / 1000:.2f} µs"),
                 (f"{name}: added by sharing them", f"{(shared - on) / 1000:.2f} µs")]
    for partitions in (1, 10):
        produce, fetch = topic_usage_ns(partitions)
        rows += [(f"usage_log.topics, Produce of {partitions} partition(s)", f"{produce / 1000:.2f} µs"),
                 (f"usage_log.topics, Fetch response of {partitions} partition(s)", f"{fetch / 1000:.2f} µs")]
    return rows
