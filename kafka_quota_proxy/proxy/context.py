"""The request context: what every stage knows about one request."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from kafka_quota_proxy.config import HostPort
from kafka_quota_proxy.identity import ANONYMOUS
from kafka_quota_proxy.identity.sasl_server import SaslServer
from kafka_quota_proxy.protocol.api_keys import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    ALTER_CONFIGS,
    ALTER_PARTITION_REASSIGNMENTS,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_RECORDS,
    DELETE_TOPICS,
    ELECT_LEADERS,
    END_TXN,
    FETCHES,
    FIND_COORDINATOR,
    HEARTBEAT,
    INCREMENTAL_ALTER_CONFIGS,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    PRODUCE,
    SHARE_ACKNOWLEDGE,
    SYNC_GROUP,
    TXN_OFFSET_COMMIT,
)
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.protocol.headers import RequestHeader
from kafka_quota_proxy.protocol.messages import decode_response
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.proxy.quota_runtime.engine import ScopeManagers
from kafka_quota_proxy.quota.managers import ChargeHandle
from kafka_quota_proxy.quota.topic_configs import AlterPlan, DescribeAdditions


@dataclass(slots=True)
class SaslState:
    """One connection's authentication progress."""

    mechanism: str | None = None  # accepted by the broker (or the proxy)
    claimed: str | None = None  # passthrough: the user named in this exchange's first token
    claimed_token: bool = False  # passthrough: `claimed` is a delegation token's id (tokenauth=true)
    rounds: int = 0
    authenticated: bool = False
    legacy: bool = False  # the handshake was v0: tokens follow as bare frames
    server: SaslServer | None = None  # terminate: the SaslServer of this exchange
    pending: dict[int, str] = field(default_factory=dict)  # correlation id -> mechanism offered
    token_id: str | None = None  # passthrough: the delegation token the connection logged in with


@dataclass(slots=True)
class ConnectionInfo:
    """Who is on the other end of a client connection."""

    peer: str  # "host:port" of the client
    listener: str  # "bootstrap" or "node-<id>"
    principal: str = ANONYMOUS
    upstream: str = ""  # the broker address this connection forwards to, once connected
    # The quota managers its requests are charged to (its scope's: `quota.scope: broker`, the
    # upstream broker's), found once with `upstream`, not at each request
    quotas: ScopeManagers | None = None
    sasl: SaslState | None = None  # once the client starts SASL
    ip: str = ""  # the client's address (from a PROXY header when there is one)
    metered: bool = False  # counted in the usage log's `connections` (at its first request)
    # ChargeHandle by quota manager: this connection's way to its sensors, kept
    charge_handles: dict[object, ChargeHandle] = field(default_factory=dict)
    # Set by QuotaCharge at each Produce (Kafka's enforcement): the client is over its quota,
    # or was by its bytes so far (`ClientQuotaManager.over_so_far`); read by ClientConnection,
    # which then reads no request ahead of the answers to those before it, as Kafka's broker.
    read_alone: bool = False
    # Topic quotas: per (topic, partition), the first idempotent batch refused on this connection
    # (producer id, epoch, base sequence) and when; until its retry comes, later batches of the
    # partition are refused too, or they would reach the broker out of sequence.
    refused_batches: dict[tuple[str, int], tuple[int, int, int, int]] | None = None

    def set_address(self, ip: str, port: int) -> None:
        self.ip = ip
        self.peer = str(HostPort(ip, port))

    def describe(self) -> str:
        return f"{self.peer} ({self.principal}, {self.listener})"


@dataclass(slots=True)
class Times:
    """When the proxy read a request, forwarded it and had the broker's answer: perf_counter()
    each (uvloop's loop.time() only ticks in whole milliseconds, too coarse for a proxy hop).
    Written by the core; read by the request quota (`request_time_ms`), the latency metrics and
    the usage log."""

    received: float = 0.0
    sent: float = 0.0  # 0.0 until forwarded (or answered by the proxy itself)
    answered: float = 0.0  # 0.0 until the broker's response arrived


@dataclass(slots=True)
class Rewrite:
    """How a request is forwarded when a request stage changed it. Written by the stages that
    change a request (QuotaCharge's fetch cap, FetchAsV15, TopicQuotas, TopicConfigs, through
    `RequestContext.patch`, `forward_as` and `replace`); read by the core when it forwards, and
    by the response stages through `RequestContext.broker_version`."""

    # Same-length replacements of the frame's bytes, (offset, bytes), applied when forwarding.
    patches: list[tuple[int, bytes]] = field(default_factory=list)
    wire_version: int = -1  # the version forwarded to the broker, when a stage changed it
    # The whole frame to forward instead of `frame`, when a stage cut parts out of it (a Produce
    # without the topics its topic quotas refused); it carries its own size prefix.
    replaced: Pieces | None = None


@dataclass(slots=True)
class Charged:
    """What QuotaCharge hands on about a request it charged. Written by QuotaCharge; read by
    QuotaSettle (`managers`) and the usage log (`permits`, `new_producer_ids`; the usage log
    counts a mutation's permits itself where QuotaCharge did not)."""

    # the quota managers the response is charged to (fetched bytes, request time), if any
    managers: ScopeManagers | None = None
    permits: int | None = None  # controller mutations: partitions created or deleted (KIP-599)
    new_producer_ids: int = 0  # Produce: producer ids new for the user (while producer_ids_rate is set)


@dataclass(slots=True)
class Topics:
    """What the topic stages hand on about a request's topics, each part with its writer and its
    readers."""

    # TopicQuotas: the scope's managers when a Fetch's or ShareFetch's topics are measured in its
    # response (read by its response stages, and by QuotaSettle when it answers empty)
    managers: ScopeManagers | None = None
    # TopicQuotas: a Produce's refused topics, (topic name or id, partition indexes), for its
    # response
    refused: list[tuple[str | bytes, tuple[int, ...]]] | None = None
    # TopicQuotas or the usage stages (topic_usage.py): a Produce's or a Fetch response's record
    # bytes per topic, (topic, bytes that went on, bytes refused by the topic's quota), when a
    # stage walked them; read by the usage log (and taken back by QuotaSettle's empty answer)
    bytes: list[tuple[str, int, int]] | None = None
    # TopicConfigs: an IncrementalAlterConfigs split between the proxy and the broker, or the
    # quota entries a DescribeConfigs response gains, for its response
    configs: AlterPlan | DescribeAdditions | None = None


@dataclass(slots=True)
class RequestContext:
    """One request on its way through the stages."""

    header: RequestHeader
    frame: memoryview  # the whole request frame, size prefix included
    conn: ConnectionInfo
    acks: int = 1  # Produce only: the request's acks (0: no response is expected)
    times: Times = field(default_factory=Times)  # when it was read, forwarded and answered
    rewrite: Rewrite | None = None  # how the request is forwarded, when a stage changed it
    charged: Charged | None = None  # what QuotaCharge hands on, when it charged the request
    throttle_ms: int = 0  # the proxy's throttle for this request; the client is muted this long
    fetch_max_wait_ms: int = 0  # a Fetch's or ShareFetch's (QuotaCharge, TopicQuotas)
    raw: bool = False  # a bare legacy SASL token (after SaslHandshake v0), not a Kafka request
    topics: Topics | None = None  # what the topic stages hand on, when one did
    # Set by a response stage that needs something done first (a delegation token's owner asked
    # of the broker): the response, and every request after it, wait until it is; an exception
    # of it (a ProtocolError) closes the connection instead.
    hold: asyncio.Future[None] | None = None

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def expects_response(self) -> bool:
        """False for a Produce with acks=0 alone: its broker answers nothing."""
        return self.acks != 0

    @property
    def broker_version(self) -> int:
        """The version the broker answers in: the client's, unless a stage lowered it."""
        rewrite = self.rewrite
        if rewrite is None or rewrite.wire_version < 0:
            return self.api_version
        return rewrite.wire_version

    def _rewrite(self) -> Rewrite:
        rewrite = self.rewrite
        if rewrite is None:
            rewrite = self.rewrite = Rewrite()
        return rewrite

    def patch(self, at: int, data: bytes) -> None:
        """Forward `data` in place of the frame's bytes at `at` (the same number of bytes)."""
        self._rewrite().patches.append((at, data))

    def forward_as(self, version: int) -> None:
        """Forward the request to the broker as `version` (its header's version bytes patched
        by the stage); the response then comes in that version (`broker_version`)."""
        self._rewrite().wire_version = version

    def replace(self, frame: Pieces) -> None:
        """Forward `frame`, which carries its own size prefix, in place of the request's."""
        self._rewrite().replaced = frame

    @property
    def replaced(self) -> Pieces | None:
        """The frame forwarded in place of the request's, if a stage replaced it."""
        return None if self.rewrite is None else self.rewrite.replaced

    def topic_work(self) -> Topics:
        """What the topic stages hand on about this request, made at its first use."""
        topics = self.topics
        if topics is None:
            topics = self.topics = Topics()
        return topics

    @property
    def topic_bytes(self) -> list[tuple[str, int, int]] | None:
        """The record bytes per topic a stage walked (`Topics.bytes`), if one did."""
        topics = self.topics
        return None if topics is None else topics.bytes

    @topic_bytes.setter
    def topic_bytes(self, counted: list[tuple[str, int, int]] | None) -> None:
        self.topic_work().bytes = counted

    def charge(self) -> Charged:
        """What QuotaCharge hands on about this request, made at its first use."""
        charged = self.charged
        if charged is None:
            charged = self.charged = Charged()
        return charged


    def throttle_for(self, throttle_ms: int) -> None:
        """Throttle this request's client for at least `throttle_ms`: the one place a request's
        throttle is set. Of several quotas over (a client's, its topics'), the longest holds, as
        on a broker; the connection applies it (KIP-219, datapath/client.py)."""
        if throttle_ms > self.throttle_ms:
            self.throttle_ms = throttle_ms

    @property
    def forward_size(self) -> int:
        """The size of the frame as forwarded, size prefix included."""
        replaced = self.replaced
        return len(self.frame) if replaced is None else len(replaced)

    def forward_parts(self) -> list[bytes | memoryview]:
        """The frame as forwarded: views of it around the patches (no copy of the rest)."""
        rewrite = self.rewrite
        if rewrite is None:
            return [self.frame]
        if rewrite.replaced is not None:
            assert not rewrite.patches, "a replaced frame is not patched"
            return list(rewrite.replaced.parts)
        frame, patches = self.frame, rewrite.patches
        if not patches:
            return [frame]
        parts: list[bytes | memoryview] = []
        pos = 0
        for at, data in sorted(patches, key=lambda p: p[0]):
            parts += [frame[pos:at], data]
            pos = at + len(data)
        parts.append(frame[pos:])
        return parts

    def decode_request(self) -> Any:
        """The request, fully decoded; a body that does not decode is the client's protocol error."""
        spec = self.header.spec
        assert spec is not None
        try:
            return spec.request.decode(bytes(self.frame[self.header.body_offset:]), version=self.api_version)
        except Exception as exc:  # kafka-python raises a variety of errors on bad bytes
            raise MalformedMessage(f"cannot decode {spec.request.name} v{self.api_version}: {exc}") from exc

    def decode_response(self, body: memoryview) -> Any:
        return decode_response(self.api_key, self.api_version, body)

    @property
    def api_version(self) -> int:
        return self.header.api_version


# Answered after a wait: for a coordinator (FindCoordinator can wait for one to load), for a
# rebalance, for replication of an offset or transaction commit, or for the controller.
WAITING_APIS = frozenset({
    FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP,
    OFFSET_COMMIT, TXN_OFFSET_COMMIT,
    INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN,
    CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, CREATE_PARTITIONS, ELECT_LEADERS,
    INCREMENTAL_ALTER_CONFIGS, ALTER_PARTITION_REASSIGNMENTS, ALTER_CONFIGS,
    SHARE_ACKNOWLEDGE,  # waits for the share coordinator to write the acknowledged state
})


def _waits_at_broker(ctx: RequestContext) -> bool:
    key = ctx.api_key
    if key in FETCHES:  # a ShareFetch long-polls as a Fetch does
        return ctx.fetch_max_wait_ms > 0
    if key == PRODUCE:
        return ctx.acks == -1
    return key in WAITING_APIS


def request_time_ms(ctx: RequestContext, now: float) -> float:
    """What the request quota charges for one request, in ms.

    Request time at a proxy. The proxy cannot see broker threads, so it charges the proxy's own
    processing time for the request and its response, plus the broker's service time as seen from
    the proxy, except for requests a broker answers only after waiting by design (`WAITING_APIS`:
    a long-poll Fetch, Produce with acks=all, coordinator lookups and group membership, offset and
    transaction commits, controller operations), whose broker time is mostly waiting, not work, and
    is not charged. An idle consumer long-polling an empty topic costs almost nothing, while a
    client busy-polling (Metadata, ListOffsets, Fetch with max_wait_ms=0) pays for every trip.
    """
    times = ctx.times
    proxy = (times.sent - times.received) + (now - times.answered)
    broker = 0.0 if _waits_at_broker(ctx) else times.answered - times.sent
    return (proxy + broker) * 1000.0
