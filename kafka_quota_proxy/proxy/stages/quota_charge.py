"""The request stage of the quotas: picks the managers a request is charged to, and charges what
is known before the broker sees it: Produce bytes, the Fetch and ShareFetch max_bytes cap,
producer ids, and strict controller-mutation checks (KIP-599).

Produce bytes at arrival. A broker reads one request per connection at a time and charges
Produce bytes as it answers, so a client over quota is muted after one request. The proxy keeps
several requests in flight per connection; had it charged Produce bytes at the response, the
requests read meanwhile (up to `max_inflight_requests`, megabytes each) would all pass before
the first throttle took hold, and the client would move in bursts of several requests. Charged
at arrival, the request that goes over quota is the last one read: the connection holds
everything after it until its response has gone out and its throttle has passed. The bytes
charged are the same; they are charged a broker round trip earlier.

Charged on arrival, the requests read ahead are still charged before the broker has answered the
ones before them, where a broker would have read them only then. That changes nothing for a
client within its quota, but ten producers starting at once each had four requests charged in
their first milliseconds, and got 3.6% more than Kafka's broker gives them over issue 27's span
(`bench.many_connections_sim`). So a client over its quota, or over it by its bytes so far
(`ClientQuotaManager.over_so_far`, which does not count the young sensor's padding that lets a
first burst through), has its connection read one request at a time, as a broker does
(`ConnectionInfo.read_alone`); within it, up to `max_inflight_requests`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka.protocol.admin.topics import (
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
)

from kafka_quota_proxy.protocol.api_keys import (
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    FETCH,
    FETCHES,
    PRODUCE,
    SHARE_FETCH,
)
from kafka_quota_proxy.protocol.error_codes import THROTTLING_QUOTA_EXCEEDED
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.fetch import read_fetch_request
from kafka_quota_proxy.protocol.primitives import INT32
from kafka_quota_proxy.protocol.produce import producer_ids, refusal
from kafka_quota_proxy.protocol.share_fetch import read_share_fetch_request
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine, ScopeManagers
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage
from kafka_quota_proxy.proxy.stages.throttling import client_of, managers, throttle
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.producer_ids import ProducerIdQuotaManager

# Exempt from the request quota, as on a broker: nothing can be charged before authentication.
# Strict (KIP-599) from these versions: over quota is refused, not throttled afterwards.
STRICT_FROM = {CREATE_TOPICS: 6, DELETE_TOPICS: 5, CREATE_PARTITIONS: 3}
# What a Produce refused for the producer-id quota (action `reject`) fails its partitions with:
# THROTTLING_QUOTA_EXCEEDED, the error KIP-599 made for a quota that refuses instead of delaying.
# The Java producer retries it (ThrottlingQuotaExceededException is retriable) until
# delivery.timeout.ms; kafka-python retries it too; librdkafka and aiokafka do not know it for
# Produce and fail the messages at once with this error. docs/producer-id-quotas.md has more.
PRODUCER_ID_REFUSAL = THROTTLING_QUOTA_EXCEEDED
THROTTLING_MESSAGE = "The throttling quota has been exceeded."
DEFAULT_NUM_PARTITIONS = 1  # Kafka's num.partitions default, for CreateTopics with -1
PACED = frozenset({PRODUCE, FETCH, SHARE_FETCH})  # held for their turn when paced (`hold_ms`)

TopicPartitions = Callable[[str], int | None]  # partition count of a topic, if known


class QuotaCharge(RequestStage):
    """Picks the managers for a request and charges what is known before forwarding."""

    holds = PACED

    def __init__(self, engine: QuotaEngine, topic_partitions: TopicPartitions) -> None:
        self.engine = engine
        self.topic_partitions = topic_partitions

    def hold_ms(self, ctx: RequestContext) -> int:
        """`quota.byte_rate_enforcement: paced`: a Produce, Fetch or ShareFetch waits unread
        until its quota entity's pace lets its bytes in (`Pacer.pace`), whichever of the entity's
        connections it came on. Each connection's mute alone lets every connection of a
        throttled entity send one request more while the others are muted: with 10 producers of
        1 MB requests, 11 s windows of 1.5x in `bench.many_connections_sim`; held here, 1.05x."""
        engine = self.engine
        settings = engine.settings
        # Asked of every Produce and Fetch: Kafka's enforcement (the default) pays one look, two
        # with a store.
        if settings.mode != "enforce":
            return 0
        if settings.byte_rate_enforcement != "paced":
            return 0 if engine.shared is None else self._owed_ms(ctx)
        conn, header = ctx.conn, ctx.header
        user, client_id = conn.principal, header.client_id or ""
        charging = engine.charging(user, client_id)
        if charging is None:
            return 0
        now = charging[1]
        key = header.api_key
        if key == FETCH:
            try:
                if read_fetch_request(ctx.frame, header.body_offset, ctx.api_version).replica_id >= 0:
                    return 0  # follower fetches are exempt
            except ProtocolError:
                return 0  # for the stages to refuse (ApiVersionsGate, WellFormed)
        q = managers(ctx)
        manager = q.produce if key == PRODUCE else q.fetch
        return manager.paced_wait_ms(user, client_id, now, conn.charge_handles, admit=True)

    def _owed_ms(self, ctx: RequestContext) -> int:
        """Kafka's enforcement, the quota shared with other replicas: a Produce waits unread
        until its connection's last Produce has paid the throttle Kafka's broker would have given
        it, knowing every replica's bytes before it, as the store's reads since have shown them
        (`SharedRate.owe`). With none owed, 0."""
        if ctx.header.api_key != PRODUCE:
            return 0
        conn = ctx.conn
        charging = self.engine.charging(conn.principal, ctx.header.client_id or "")
        if charging is None:
            return 0
        return managers(ctx).produce.owed_wait_ms(conn.charge_handles, charging[1])

    def on_request(self, ctx: RequestContext) -> Reply | None:
        engine = self.engine
        conn, header = ctx.conn, ctx.header
        user, client_id = conn.principal, header.client_id or ""
        charging = engine.charging(user, client_id)
        if charging is None:
            return None
        switches, now = charging
        q = managers(ctx)
        key = header.api_key
        if key == FETCH:
            info = read_fetch_request(ctx.frame, header.body_offset, ctx.api_version)
            if info.replica_id >= 0:
                return None  # follower fetches are exempt, as on a broker
            ctx.fetch_max_wait_ms = info.max_wait_ms
            if switches.enforcing and info.max_bytes_at is not None and info.max_bytes is not None:
                self._cap_max_bytes(ctx, q, info.max_bytes_at, info.max_bytes)
        elif key == SHARE_FETCH:
            # Kafka caps a ShareFetch's max_bytes as a Fetch's (KafkaApis
            # handleFetchFromShareFetchRequest, maxQuotaWindowBytes) and charges its response.
            share = read_share_fetch_request(ctx.frame, header.body_offset)
            ctx.fetch_max_wait_ms = share.max_wait_ms
            if switches.enforcing:
                self._cap_max_bytes(ctx, q, share.max_bytes_at, share.max_bytes)
        if key in FETCHES or switches.request_quotas:
            ctx.charge().managers = q  # QuotaSettle has the response to charge: fetched bytes, request time
        if key == PRODUCE:
            if switches.counting_producer_ids:
                refused = self._producer_ids(ctx, q.producer_ids, user, now, switches.enforcing)
                if refused is not None:
                    return refused
            # Charged on arrival: the connection then reads nothing more from a client over its
            # quota until the throttle is over (see the module docstring). What goes on to the
            # broker: a topic quota may have cut refused topics out. Over its quota, or by its
            # bytes so far, the connection reads one request at a time, as a broker does (see
            # the module docstring); paced, the requests wait for their turns instead.
            throttle_ms, over = q.produce.charge(user, client_id, ctx.forward_size - 4, now,
                                                 conn.charge_handles, switches.paced)
            if throttle_ms:
                throttle(engine, ctx, QuotaKey.PRODUCER_BYTE_RATE, throttle_ms, now)
            conn.read_alone = over
        elif key in STRICT_FROM:
            return self._mutation(ctx, q, now, switches.enforcing)
        return None

    def _producer_ids(self, ctx: RequestContext, manager: ProducerIdQuotaManager, user: str,
                      now: int, enforcing: bool) -> Reply | None:
        """KIP-936: count the request's producer ids new for the user; throttle, or with the
        `reject` action refuse the request unforwarded (see PRODUCER_ID_REFUSAL)."""
        engine = self.engine
        try:
            pids = producer_ids(ctx.frame, ctx.header.body_offset, ctx.api_version)
        except ProtocolError:
            return None  # malformed records: the broker answers CORRUPT_MESSAGE for them
        if not pids:
            return None
        strict = enforcing and engine.settings.producer_ids.action == "reject"
        charge = manager.charge(user, pids, now, strict)
        ctx.charge().new_producer_ids = 0 if charge.rejected else charge.new_ids
        throttle(engine, ctx, QuotaKey.PRODUCER_IDS_RATE, charge.throttle_ms, now, per_user=True)
        if not charge.rejected:
            return None
        if not ctx.expects_response:
            return Reply(None)  # acks=0: dropped, and the connection muted for the throttle
        message = (f"{charge.new_ids} new producer id(s) would exceed the producer_ids_rate quota "
                   f"of user {user!r}; retry after {charge.throttle_ms} ms")
        return Reply(refusal(ctx.decode_request(), ctx.api_version, PRODUCER_ID_REFUSAL, message,
                             ctx.throttle_ms))

    def _cap_max_bytes(self, ctx: RequestContext, q: ScopeManagers, at: int, max_bytes: int) -> None:
        user, client_id = client_of(ctx)
        cap = self._fetch_cap(q, user, client_id)
        if cap < max_bytes:
            ctx.patch(at, INT32.pack(max(int(cap), 1)))

    def _fetch_cap(self, q: ScopeManagers, user: str, client_id: str) -> float:
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

    def _mutation(self, ctx: RequestContext, q: ScopeManagers, now: int, enforcing: bool) -> Reply | None:
        engine = self.engine
        user, client_id = client_of(ctx)
        request = ctx.decode_request()
        permits = ctx.charge().permits = mutation_permits(ctx.api_key, request, self.topic_partitions)
        if ctx.api_version >= STRICT_FROM[ctx.api_key] and enforcing:
            accepted, throttle_ms = q.mutation.record_strict(user, client_id, permits, now)
            if not accepted:
                throttle(engine, ctx, QuotaKey.CONTROLLER_MUTATION_RATE, throttle_ms, now)
                return Reply(_refusal(ctx.api_key, ctx.api_version, request, throttle_ms))
            return None
        throttle(engine, ctx, QuotaKey.CONTROLLER_MUTATION_RATE,
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


