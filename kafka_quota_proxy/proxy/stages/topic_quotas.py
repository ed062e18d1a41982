"""Topic quotas at the proxy (quota/topics.py measures and decides; docs/topic-quotas.md).

Produce: a topic's bytes are charged as the request arrives, from its partitions' record sizes.
The request that takes a topic over its budget passes, as on Kafka, and the topic is refused
while its rate stays over: the partitions of a refused topic are answered with the error of
`quota.topic_refusal` without reaching the broker, while the request's other topics go through.
The client retries the refused batches after its retry backoff. No throttle_time_ms is written and
the connection is not muted for a topic: a client that honours throttle_time_ms (KIP-219) would
hold back every topic it writes to that broker, and the quota is the topic's, not the client's.
With acks=0 nothing can be refused without losing records, so such a request passes and its
connection is muted for the throttle, as a client quota would.

Fetch: a topic's bytes are counted from the response's partitions. A topic over its budget is
taken back and its partitions are answered empty (the records alone: offsets, watermarks and
errors stay), as a throttled fetch answers everything empty; the other topics keep their data.
A response left with no records at all carries the throttle, capped at the request's
max_wait_ms, and the connection waits it out: the wait a long poll would have had, instead of
the client fetching the same refused records again at once.

ShareFetch (KIP-932): a topic's bytes are counted from the response's partitions as a Fetch's
are, but nothing is taken out: the broker has acquired those records for the member, and records
dropped from the response would stay locked, undeliverable, until their acquisition lock runs out
(docs/quotas.md, "Share groups"). So the records are delivered and stay counted, and while a topic
is over its budget the connection waits out the topic's throttle, as a client quota's does, the
one way left to slow its share consumers. The wait is capped at half the records' acquisition
lock, so that the member can still acknowledge what it was just given before the lock runs out.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer.produce import ProduceResponse

from kafka_quota_proxy.protocol.api_keys import FETCH, PRODUCE, SHARE_FETCH
from kafka_quota_proxy.protocol.error_codes import NOT_ENOUGH_REPLICAS, THROTTLING_QUOTA_EXCEEDED
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.fetch import read_fetch_request
from kafka_quota_proxy.protocol.messages import encode_element
from kafka_quota_proxy.protocol.pieces import Pieces, spliced
from kafka_quota_proxy.protocol.primitives import encode_length, read_length
from kafka_quota_proxy.protocol.produce import batch_sequence, refusal
from kafka_quota_proxy.protocol.share_fetch import read_share_fetch_head, share_fetch_topics
from kafka_quota_proxy.protocol.topic_bytes import (
    fetch_emptied,
    fetch_topics,
    produce_layout,
    produce_without,
)
from kafka_quota_proxy.protocol.walk import response_walker
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage, ResponseStage
from kafka_quota_proxy.proxy.stages.throttling import client_of, managers
from kafka_quota_proxy.quota.entities import QuotaKey

# The topic kinds (quota/kinds.py), looked up on every Produce and Fetch.
PRODUCE_BYTES = QuotaKey.PRODUCER_BYTE_RATE
FETCH_BYTES = QuotaKey.CONSUMER_BYTE_RATE

# What a refused topic's partitions fail with, by `quota.topic_refusal`. The choice and what each
# client does with it (bench/produce_refusal_clients.py): docs/topic-quotas.md.
TOPIC_REFUSALS = {"not_enough_replicas": NOT_ENOUGH_REPLICAS,
                  "throttling_quota_exceeded": THROTTLING_QUOTA_EXCEEDED}
PRODUCE_TYPE, FETCH_TYPE = "topic_produce", "topic_fetch"  # the throttle metrics' quota_type
# Whatever the code says, the message (Produce v8+) tells the truth.
RESPONSES = "Responses"  # a Produce response's per-topic results
REFUSED_MESSAGE = "The topic's producer_byte_rate quota at the proxy is exceeded; retry later"


def _count(engine: QuotaEngine, quota_type: str, topic: str, throttle_ms: int, now: int) -> None:
    engine.topic_throttles.add(quota_type, topic, "", throttle_ms, now)


class TopicQuotaCharge(RequestStage):
    """Charges a Produce's topics on arrival and refuses those over their budget; marks a Fetch
    or a ShareFetch whose response TopicFetchSettle or TopicShareFetchSettle is to measure."""

    api_keys = frozenset({PRODUCE, FETCH, SHARE_FETCH})

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine

    def on_request(self, ctx: RequestContext) -> Reply | None:
        engine = self.engine
        switches = engine.switches()
        fetch = ctx.api_key != PRODUCE
        if (FETCH_BYTES if fetch else PRODUCE_BYTES) not in switches.topics:
            return None
        if switches.exempting and engine.exempt(*client_of(ctx)):
            return None
        if ctx.api_key == SHARE_FETCH:  # only consumers share-fetch: no follower to tell apart
            ctx.topic_work().managers = managers(ctx)
            return None
        if fetch:
            info = read_fetch_request(ctx.frame, ctx.header.body_offset, ctx.api_version)
            if info.replica_id < 0:  # a follower's fetch is the cluster's own, never a tenant's
                ctx.topic_work().managers = managers(ctx)
                ctx.fetch_max_wait_ms = info.max_wait_ms
            return None
        return self._produce(ctx)

    def _produce(self, ctx: RequestContext) -> Reply | None:
        engine = self.engine
        try:
            layout = produce_layout(ctx.frame, ctx.header.body_offset, ctx.api_version)
        except ProtocolError:
            return None  # the broker answers a request it cannot read
        manager = managers(ctx).topics[PRODUCE_BYTES]
        now = engine.clock()
        enforcing = engine.enforcing
        refused: list[int] = []
        counted: list[tuple[str, int, int]] = []
        longest = 0
        # acks=0 cannot be refused without losing records unseen: its bytes pass and count.
        refuse = enforcing and ctx.expects_response
        for index, topic in enumerate(layout.topics):
            name = engine.leadership.named(topic.name, topic.topic_id)
            if name is None:
                continue  # an id no Metadata has named yet: not measured
            # Batch sequences are read only where a refusal is held or made (not on every Produce).
            batches = None
            if refuse and ctx.conn.refused_batches:
                batches = _batches(ctx, topic.records_at)
                if _out_of_turn(ctx.conn, name, topic.partitions, batches, now):
                    _count(engine, PRODUCE_TYPE, name, 0, now)
                    refused.append(index)
                    counted.append((name, 0, topic.size))
                    continue
            charge = manager.admit(name, topic.size, now, refuse)
            if charge.throttle_ms:
                _count(engine, PRODUCE_TYPE, name, charge.throttle_ms, now)
                longest = max(longest, charge.throttle_ms)
                if refuse:
                    refused.append(index)
                    counted.append((name, 0, topic.size))
                    _remember(ctx.conn, name, topic.partitions,
                              batches if batches is not None else _batches(ctx, topic.records_at), now)
                    continue
            elif ctx.conn.refused_batches:
                for partition in topic.partitions:
                    ctx.conn.refused_batches.pop((name, partition), None)
            counted.append((name, topic.size, 0))
        ctx.topic_bytes = counted
        if enforcing and not ctx.expects_response and longest:
            ctx.throttle_for(longest)  # the connection waits instead
        if not refused:
            return None
        if len(refused) == len(layout.topics):
            names = sorted({engine.leadership.named(t.name, t.topic_id) or "?" for t in layout.topics})
            message = f"{REFUSED_MESSAGE}: {', '.join(names)}"
            request = ctx.decode_request()
            return Reply(refusal(request, ctx.api_version, refusal_code(engine), message, ctx.throttle_ms))
        keep = [i for i in range(len(layout.topics)) if i not in set(refused)]
        ctx.replace(produce_without(ctx.frame, ctx.header.body_offset, ctx.api_version, layout, keep))
        ctx.topic_work().refused = [
            (t.name if t.name is not None else t.topic_id or b"", t.partitions)
            for t in (layout.topics[i] for i in refused)]
        return None


# A refused batch whose retry has not come for this long no longer holds its partition back (a
# client that gave up on it, or restarted its sequence some way not seen here).
REFUSED_BATCH_EXPIRY_MS = 60_000

Batch = tuple[int, int, int] | None  # (producer id, epoch, base sequence) of an idempotent batch


def _batches(ctx: RequestContext, records_at: tuple[int, ...]) -> list[Batch]:
    return [batch_sequence(ctx.frame, at) for at in records_at]


def _out_of_turn(conn: ConnectionInfo, topic: str, partitions: tuple[int, ...], batches: list[Batch],
                 now: int) -> bool:
    """Whether some partition carries an idempotent batch later than one refused before on this
    connection and not yet retried: taken, it would reach the broker out of sequence (the
    broker then answers OUT_OF_ORDER_SEQUENCE_NUMBER; Tansu fences the producer)."""
    held = conn.refused_batches
    if not held:
        return False
    for partition, batch in zip(partitions, batches, strict=True):
        first = held.get((topic, partition))
        if first is None or batch is None:
            continue
        pid, epoch, sequence, at = first
        if now - at >= REFUSED_BATCH_EXPIRY_MS or (pid, epoch) != batch[:2]:
            del held[(topic, partition)]  # expired, or another producer session: forget it
        elif batch[2] != sequence:
            return True
    return False


def _remember(conn: ConnectionInfo, topic: str, partitions: tuple[int, ...], batches: list[Batch],
              now: int) -> None:
    """Keep the first refused idempotent batch of each partition, to hold later ones back."""
    for partition, batch in zip(partitions, batches, strict=True):
        if batch is not None:
            if conn.refused_batches is None:
                conn.refused_batches = {}
            conn.refused_batches.setdefault((topic, partition), (*batch, now))


def refusal_code(engine: QuotaEngine) -> int:
    return TOPIC_REFUSALS[engine.settings.topic_refusal]


class TopicProduceRefusals(ResponseStage):
    """Adds the refused topics' partitions, failed with `quota.topic_refusal`'s error, to the
    broker's answer to the rest of the request."""

    api_keys = frozenset({PRODUCE})

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine

    def wants(self, ctx: RequestContext) -> bool:
        return ctx.topics is not None and ctx.topics.refused is not None

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        refused = ctx.topics.refused if ctx.topics is not None else None
        assert refused is not None
        version = ctx.broker_version
        topic = ProduceResponse.TopicProduceResponse
        part = topic.PartitionProduceResponse
        message = REFUSED_MESSAGE
        code = refusal_code(self.engine)
        added = [topic(
            name=key if isinstance(key, str) else None,
            topic_id=key if isinstance(key, bytes) and version >= 13 else None,
            partition_responses=[part(index=p, error_code=code, base_offset=-1,
                                      log_append_time_ms=-1, log_start_offset=-1, record_errors=[],
                                      error_message=message, current_leader=None)
                                 for p in partitions])
            for key, partitions in refused]
        return appended(body, ctx.api_version, added)


def appended(body: memoryview, version: int, topics: list[Any]) -> Pieces:
    """A Produce response with `topics` added at the end of its responses. Only the array's count
    changes; the broker's bytes around it (tagged fields included) are kept, and not copied."""
    top = response_walker(PRODUCE, version)
    at = top.walk(body, 0)
    start, end = at.span(RESPONSES)
    compact = top.compact(RESPONSES)
    count, first = read_length(body, start, compact)
    added = b"".join(encode_element(t, version, top.flexible) for t in topics)
    return spliced(body, [(start, first, encode_length(max(count, 0) + len(topics), compact)),
                          (end, end, added)])


class TopicFetchSettle(ResponseStage):
    """Counts a Fetch response's bytes per topic and answers a topic over its budget empty."""

    api_keys = frozenset({FETCH})

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine

    def wants(self, ctx: RequestContext) -> bool:
        return ctx.topics is not None and ctx.topics.managers is not None

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        engine, q = self.engine, ctx.topics.managers if ctx.topics is not None else None
        assert q is not None
        try:
            layout = fetch_topics(body, ctx.broker_version)
        except ProtocolError:
            return None  # what the client makes of it is the broker's answer, unchanged
        manager = q.topics[FETCH_BYTES]
        now = engine.clock()
        enforcing = engine.enforcing
        hot: set[int] = set()
        counted: list[tuple[str, int, int]] = []
        longest = 0
        delivered = 0
        for index, topic in enumerate(layout.topics):
            if not topic.size:
                continue
            name = engine.leadership.named(topic.name, topic.topic_id)
            if name is None:  # an id no Metadata has named yet: not measured
                delivered += topic.size
                continue
            charge = manager.record(name, topic.size, now)
            if charge.throttle_ms:
                _count(engine, FETCH_TYPE, name, charge.throttle_ms, now)
                if enforcing:
                    # As Kafka takes back a throttled fetch's bytes: they were not delivered.
                    manager.unrecord(name, topic.size, now)
                    hot.add(index)
                    longest = max(longest, charge.throttle_ms)
                    counted.append((name, 0, topic.size))
                    continue
            delivered += topic.size
            counted.append((name, topic.size, 0))
        ctx.topic_bytes = counted
        if not hot:
            return None
        if not delivered:
            ctx.throttle_for(min(longest, ctx.fetch_max_wait_ms))
        return fetch_emptied(body, ctx.broker_version, layout, hot)


# How much of the records' acquisition lock a topic's throttle may keep a share consumer's
# connection waiting: the rest is the member's to process and acknowledge what it was given.
SHARE_WAIT_OF_LOCK = 0.5


class TopicShareFetchSettle(ResponseStage):
    """Counts a ShareFetch response's bytes per topic; while a topic is over its budget the
    connection waits out its throttle. The records are always delivered (module docstring)."""

    api_keys = frozenset({SHARE_FETCH})

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine

    def wants(self, ctx: RequestContext) -> bool:
        return ctx.topics is not None and ctx.topics.managers is not None

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        engine, q = self.engine, ctx.topics.managers if ctx.topics is not None else None
        assert q is not None
        version = ctx.broker_version
        try:
            topics = share_fetch_topics(body, version)
        except ProtocolError:
            return None  # what the client makes of it is the broker's answer, unchanged
        manager = q.topics[FETCH_BYTES]
        now = engine.clock()
        counted: list[tuple[str, int, int]] = []
        longest = 0
        for topic in topics:
            if not topic.size:
                continue
            name = engine.leadership.named(None, topic.topic_id)
            if name is None:  # an id no Metadata has named yet: not measured
                continue
            # Recorded and kept, unlike a Fetch's: these records are delivered.
            charge = manager.record(name, topic.size, now)
            if charge.throttle_ms:
                _count(engine, FETCH_TYPE, name, charge.throttle_ms, now)
                longest = max(longest, charge.throttle_ms)
            counted.append((name, topic.size, 0))
        ctx.topic_bytes = counted
        if longest and engine.enforcing:
            lock_ms = read_share_fetch_head(body, version).acquisition_lock_timeout_ms
            if lock_ms > 0:  # v0 (early access) has no lock in its answer
                longest = min(longest, int(lock_ms * SHARE_WAIT_OF_LOCK))
            ctx.throttle_for(longest)
        return None
