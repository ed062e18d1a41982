"""Quota enforcement as stages, the way a Kafka broker applies quotas (KIP-219).

The request stage picks the managers to charge and applies what is known before the broker
sees the request: Produce bytes, the Fetch max_bytes cap, and strict controller-mutation checks.
The response stage charges what is known only when the response arrives (Fetch bytes, request
time) and, for Fetch, swaps in Kafka's throttled empty response. The last response stage writes
max(broker's, proxy's) throttle into `throttle_time_ms`; the connection then stops reading from
the client for the proxy's throttle.

Produce bytes at arrival. A broker reads one request per connection at a time and charges
Produce bytes as it answers, so a client over quota is muted after one request. The proxy keeps
several requests in flight per connection; had it charged Produce bytes at the response, the
requests read meanwhile (up to `max_inflight_requests`, megabytes each) would all pass before
the first throttle took hold, and the client would move in bursts of several requests. Charged
at arrival, the request that goes over quota is the last one read: the connection holds
everything after it until its response has gone out and its throttle has passed. The bytes
charged are the same; they are charged a broker round trip earlier.

Request time at a proxy. The proxy cannot see broker threads, so it charges the proxy's own
processing time for the request and its response, plus the broker's service time as seen from
the proxy, except for requests a broker answers only after waiting by design (`WAITING_APIS`:
a long-poll Fetch, Produce with acks=all, coordinator lookups and group membership, offset and
transaction commits, controller operations), whose broker time is mostly waiting, not work, and
is not charged. An idle consumer long-polling an empty topic costs almost nothing, while a
client busy-polling (Metadata, ListOffsets, Fetch with max_wait_ms=0) pays for every trip.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

from kafka.protocol.admin.topics import (
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
)

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.fetch import FETCH, read_fetch_request, session_id, throttled_response_body
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.primitives import INT32
from kafka_quota_proxy.protocol.produce import PRODUCE, producer_ids, refusal
from kafka_quota_proxy.protocol.throttle import patched, read_throttle, throttle_offset
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quotas.engine import QuotaEngine, ScopeManagers
from kafka_quota_proxy.proxy.stages.base import Replacement, Reply, RequestStage, ResponseStage
from kafka_quota_proxy.quota.producer_ids import ProducerIdQuotaManager
from kafka_quota_proxy.quota.resolution import sanitize_user

SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 17, 18, 36
CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 19, 20, 37
# Exempt from the request quota, as on a broker: nothing can be charged before authentication.
REQUEST_QUOTA_EXEMPT = frozenset({SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE})
# Strict (KIP-599) from these versions: over quota is refused, not throttled afterwards.
STRICT_FROM = {CREATE_TOPICS: 6, DELETE_TOPICS: 5, CREATE_PARTITIONS: 3}
THROTTLING_QUOTA_EXCEEDED = 89
# What a Produce refused for the producer-id quota (action `reject`) fails its partitions with:
# THROTTLING_QUOTA_EXCEEDED, the error KIP-599 made for a quota that refuses instead of delaying.
# The Java producer retries it (ThrottlingQuotaExceededException is retriable) until
# delivery.timeout.ms; kafka-python retries it too; librdkafka and aiokafka do not know it for
# Produce and fail the messages at once with this error. README "Producer-id quotas" has more.
PRODUCER_ID_REFUSAL = THROTTLING_QUOTA_EXCEEDED
THROTTLING_MESSAGE = "The throttling quota has been exceeded."
DEFAULT_NUM_PARTITIONS = 1  # Kafka's num.partitions default, for CreateTopics with -1

TopicPartitions = Callable[[str], int | None]  # partition count of a topic, if known


def _client(ctx: RequestContext) -> tuple[str, str]:
    return ctx.conn.principal, ctx.header.client_id or ""


class QuotaCharge(RequestStage):
    """Picks the managers for a request and charges what is known before forwarding."""

    def __init__(self, engine: QuotaEngine, topic_partitions: TopicPartitions) -> None:
        self.engine = engine
        self.topic_partitions = topic_partitions

    def on_request(self, ctx: RequestContext) -> Reply | None:
        engine = self.engine
        switches = engine.switches()
        if not switches.charging:
            return None
        conn, header = ctx.conn, ctx.header
        user, client_id = conn.principal, header.client_id or ""
        if switches.exempting and engine.exempt(user, client_id):
            return None
        q = engine.scope(conn.upstream)
        key = header.api_key
        if key == FETCH:
            info = read_fetch_request(ctx.frame, header.body_offset, ctx.api_version)
            if info.replica_id >= 0:
                return None  # follower fetches are exempt, as on a broker
            ctx.fetch_max_wait_ms = info.max_wait_ms
            if engine.enforcing and info.max_bytes_at is not None and info.max_bytes is not None:
                cap = self._fetch_cap(q, user, client_id)
                if cap < info.max_bytes:
                    ctx.patch(info.max_bytes_at, INT32.pack(max(int(cap), 1)))
        if key == FETCH or switches.request_quotas:
            ctx.quota = q  # QuotaSettle has the response to charge: Fetch bytes, request time
        if key == PRODUCE:
            now = engine.clock()
            if switches.counting_producer_ids:
                refused = self._producer_ids(ctx, q.producer_ids, user, now)
                if refused is not None:
                    return refused
            # Charged on arrival: the connection then reads nothing more from a client over its
            # quota until the throttle is over (see the module docstring).
            throttle_ms = q.produce.record_and_get_throttle_ms(user, client_id, len(ctx.frame) - 4, now,
                                                               conn.charge_handles)
            if throttle_ms:
                throttle(engine, ctx, "produce", throttle_ms, now)
        elif key in STRICT_FROM:
            return self._mutation(ctx, q)
        return None

    def _producer_ids(self, ctx: RequestContext, manager: ProducerIdQuotaManager, user: str,
                      now: int) -> Reply | None:
        """KIP-936: count the request's producer ids new for the user; throttle, or with the
        `reject` action refuse the request unforwarded (see PRODUCER_ID_REFUSAL)."""
        engine = self.engine
        try:
            pids = producer_ids(ctx.frame, ctx.header.body_offset, ctx.api_version)
        except ProtocolError:
            return None  # malformed records: the broker answers CORRUPT_MESSAGE for them
        if not pids:
            return None
        strict = engine.enforcing and engine.settings.producer_ids.action == "reject"
        charge = manager.charge(user, pids, now, strict)
        ctx.new_producer_ids = 0 if charge.rejected else charge.new_ids
        throttle(engine, ctx, "producer_ids", charge.throttle_ms, now, per_user=True)
        if not charge.rejected:
            return None
        if not ctx.expects_response:
            return Reply(None)  # acks=0: dropped, and the connection muted for the throttle
        message = (f"{charge.new_ids} new producer id(s) would exceed the producer_ids_rate quota "
                   f"of user {user!r}; retry after {charge.throttle_ms} ms")
        return Reply(refusal(ctx.decode_request(), ctx.api_version, PRODUCER_ID_REFUSAL, message,
                             ctx.throttle_ms))

    def _fetch_cap(self, q: Any, user: str, client_id: str) -> float:
        """Kafka caps max_bytes at Q*(N-1)*W (getMaxValueInQuotaWindow). The proxy caps at one
        sample's worth, Q*W, a tenth of that by default, so that one response never holds more
        than a second of quota. With Kafka's cap, Tansu (which sizes responses by max_bytes
        and ignores max.partition.fetch.bytes) answered 6 MB at a time to a 1 MiB/s consumer:
        one delivery fitted per window and the consumer averaged a fraction of its quota."""
        window_max = q.fetch.max_value_in_quota_window(user, client_id)
        quota = q.fetch.quota(user, client_id)
        if quota is None:
            return float(window_max)
        return min(window_max, quota * self.engine.config.window_ms / 1000)

    def _mutation(self, ctx: RequestContext, q: ScopeManagers) -> Reply | None:
        engine = self.engine
        user, client_id = _client(ctx)
        request = ctx.decode_request()
        permits = ctx.permits = mutation_permits(ctx.api_key, request, self.topic_partitions)
        now = engine.clock()
        if ctx.api_version >= STRICT_FROM[ctx.api_key] and engine.enforcing:
            accepted, throttle_ms = q.mutation.record_strict(user, client_id, permits, now)
            if not accepted:
                throttle(engine, ctx, "controller_mutation", throttle_ms, now)
                return Reply(_refusal(ctx.api_key, ctx.api_version, request, throttle_ms))
            return None
        throttle(engine, ctx, "controller_mutation",
                 q.mutation.record_permissive(user, client_id, permits, now), now)
        return None


def mutation_permits(api_key: int, request: Any, topic_partitions: TopicPartitions) -> int:
    """Partitions created or deleted by a decoded CreateTopics, CreatePartitions or DeleteTopics
    request, as KIP-599 counts them."""
    if api_key == CREATE_TOPICS:
        total = 0
        for topic in request.topics:
            if topic.assignments:
                total += len(topic.assignments)
            else:
                total += topic.num_partitions if topic.num_partitions > 0 else DEFAULT_NUM_PARTITIONS
        return total
    if api_key == CREATE_PARTITIONS:
        total = 0
        for topic in request.topics:
            current = topic_partitions(topic.name)
            total += max(topic.count - current, 0) if current is not None else topic.count
        return total
    names = (request.topic_names or []) if request.API_VERSION < 6 else [t.name for t in request.topics]
    # A topic named only by id (v6+) counts too: its partition count is not known here.
    return sum((topic_partitions(name) if name else None) or 1 for name in names)


def _refusal(api_key: int, version: int, request: Any, throttle_ms: int) -> bytes:
    """The strict-mode answer: every topic fails with THROTTLING_QUOTA_EXCEEDED."""
    if api_key == CREATE_TOPICS:
        cls: Any = CreateTopicsResponse
        topics = [cls.CreatableTopicResult(name=t.name, error_code=THROTTLING_QUOTA_EXCEEDED,
                                           error_message=THROTTLING_MESSAGE, num_partitions=-1,
                                           replication_factor=-1, configs=None)
                  for t in request.topics]
        msg = cls(version=version, throttle_time_ms=throttle_ms, topics=topics)
    elif api_key == CREATE_PARTITIONS:
        cls = CreatePartitionsResponse
        msg = cls(version=version, throttle_time_ms=throttle_ms, results=[
            cls.CreatePartitionsTopicResult(name=t.name, error_code=THROTTLING_QUOTA_EXCEEDED,
                                            error_message=THROTTLING_MESSAGE)
            for t in request.topics])
    else:
        cls = DeleteTopicsResponse
        names = (request.topic_names or []) if version < 6 else [t.name for t in request.topics]
        ids = [None] * len(names) if version < 6 else [t.topic_id for t in request.topics]
        msg = cls(version=version, throttle_time_ms=throttle_ms, responses=[
            cls.DeletableTopicResult(name=n, topic_id=i, error_code=THROTTLING_QUOTA_EXCEEDED,
                                     error_message=THROTTLING_MESSAGE)
            for n, i in zip(names, ids, strict=True)])
    return bytes(msg.encode(version=version))


def throttle(engine: QuotaEngine, ctx: RequestContext, quota_type: str, throttle_ms: int,
             now_ms: int, per_user: bool = False) -> None:
    """Count a throttle and, when enforcing, hold the client for it. `per_user`: the quota is
    the user's alone (producer ids), so the throttle is counted without a client-id."""
    if throttle_ms <= 0:
        return
    user, client_id = _client(ctx)
    engine.throttles.add(quota_type, sanitize_user(user), "" if per_user else client_id, throttle_ms, now_ms)
    if engine.usage is not None:
        engine.usage.throttled(user, client_id, quota_type, throttle_ms)
    if engine.enforcing:
        ctx.throttle_ms = max(ctx.throttle_ms, throttle_ms)


# Answered after a wait: for a coordinator (FindCoordinator can wait for one to load), for a
# rebalance, for replication of an offset or transaction commit, or for the controller.
WAITING_APIS = frozenset({
    10,  # FindCoordinator
    11, 12, 13, 14,  # JoinGroup, Heartbeat, LeaveGroup, SyncGroup
    8, 28,  # OffsetCommit, TxnOffsetCommit
    22, 24, 25, 26,  # InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn
    19, 20, 21, 37, 43, 44, 45, 33,  # Create/DeleteTopics, DeleteRecords, CreatePartitions,
    # ElectLeaders, IncrementalAlterConfigs, AlterPartitionReassignments, AlterConfigs
})


def _waits_at_broker(ctx: RequestContext) -> bool:
    key = ctx.api_key
    if key == FETCH:
        return ctx.fetch_max_wait_ms > 0
    if key == PRODUCE:
        return ctx.acks == -1
    return key in WAITING_APIS


def request_time_ms(ctx: RequestContext, now: float) -> float:
    """What the request quota charges for one request; see the module docstring."""
    proxy = (ctx.sent_at - ctx.received_at) + (now - ctx.answered_at)
    broker = 0.0 if _waits_at_broker(ctx) else ctx.answered_at - ctx.sent_at
    return (proxy + broker) * 1000.0


class QuotaSettle(ResponseStage):
    """Charges what the response tells: Produce and Fetch bytes, request time. A streamed Fetch
    is charged from its head: its size is known from the frame's size prefix."""

    streams = True

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine

    def wants(self, ctx: RequestContext) -> bool:
        # Only Fetch bytes and request time are charged here: QuotaCharge sets ctx.quota for
        # those alone. Without a request quota a Produce (charged on arrival) or a Metadata
        # response has nothing left to settle.
        return ctx.quota is not None

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        return self._settle(ctx, body, len(body))

    def on_head(self, ctx: RequestContext, head: memoryview, body_size: int) -> bytes | Replacement | None:
        body = self._settle(ctx, head, body_size)
        if body is None:
            return None
        return Replacement(body.join() if isinstance(body, Pieces) else bytes(body))

    def _settle(self, ctx: RequestContext, body: memoryview, body_size: int) -> bytes | Pieces | None:
        """`body` is the response body, or at least its start (a streamed Fetch)."""
        engine, q = self.engine, ctx.quota
        user, client_id = _client(ctx)
        now = engine.clock()
        key = ctx.api_key
        request_throttle = 0
        if key not in REQUEST_QUOTA_EXEMPT and q.request.quotas_enabled:
            request_throttle = q.request.record_and_get_throttle_ms(
                user, client_id, request_time_ms(ctx, perf_counter()), now, ctx.conn.charge_handles)
        if key == FETCH:
            size = body_size + 4  # FetchResponse.sizeOf: the body and its 4-byte size
            fetch_throttle = q.fetch.record_and_get_throttle_ms(user, client_id, size, now,
                                                                ctx.conn.charge_handles)
            if fetch_throttle > 0 or request_throttle > 0:
                throttle(engine, ctx, "fetch", fetch_throttle, now)
                throttle(engine, ctx, "request", request_throttle, now)
                if engine.enforcing:
                    # Kafka un-records the bytes and sends an empty response in their place,
                    # still carrying max(broker's, proxy's) throttle.
                    q.fetch.unrecord(user, client_id, size, now)
                    at = throttle_offset(FETCH, ctx.api_version, body)
                    broker_ms = read_throttle(body, at) if at is not None else 0
                    return throttled_response_body(ctx.api_version, max(ctx.throttle_ms, broker_ms),
                                                   session_id(body, ctx.api_version))
                return None
        throttle(engine, ctx, "request", request_throttle, now)
        return None


class ThrottleMerge(ResponseStage):
    """throttle_time_ms = max(broker's, proxy's), on every response that carries it."""

    streams = True

    def wants(self, ctx: RequestContext) -> bool:
        return ctx.throttle_ms > 0

    def on_head(self, ctx: RequestContext, head: memoryview, body_size: int) -> bytes | Replacement | None:
        new = self.on_response(ctx, head)  # throttle_time_ms leads the body
        return None if new is None else bytes(new.join() if isinstance(new, Pieces) else new)

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        at = throttle_offset(ctx.api_key, ctx.api_version, body)
        if at is None or read_throttle(body, at) >= ctx.throttle_ms:
            return None
        return patched(body, at, ctx.throttle_ms)
