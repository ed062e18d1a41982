"""The response stage that charges what only the response tells (Fetch and ShareFetch bytes,
request time) and, for a fetch over quota, swaps in Kafka's throttled empty response (KIP-219).

A ShareFetch is charged as Kafka 4.4 charges it (KafkaApis.processShareFetchResponse, see
docs/quotas.md, "Share groups"): once its records are in hand, the request quota first, then the
consumer byte-rate quota with the response's size. Over either, by default (`quota.
share_fetch_throttle: deliver`) the client gets its records with the throttle and the connection
is muted for it, the bytes staying charged, as for a Produce; over the byte rate, the throttle is
the time the response's bytes take at the quota, each such delivery spaced after the last
(`Pacer.pace_ms`), rather than Kafka's. Kafka instead takes the bytes back
and answers empty (`empty`): the records the broker acquired for that fetch stay locked until
their lock times out, and a share consumer under a quota stalls (measured on Kafka 4.4 itself:
0.27 of its quota, then the client gave up).
"""

from __future__ import annotations

from time import perf_counter

from kafka_quota_proxy.protocol.api_keys import FETCH, FETCHES
from kafka_quota_proxy.protocol.error_codes import INVALID_SHARE_SESSION_EPOCH, NONE
from kafka_quota_proxy.protocol.fetch import session_id, throttled_response_body
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.share_fetch import read_share_fetch_head, throttled_share_fetch_body
from kafka_quota_proxy.protocol.throttle import read_throttle, throttle_offset
from kafka_quota_proxy.proxy.context import RequestContext, request_time_ms
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine, ScopeManagers
from kafka_quota_proxy.proxy.stages.base import Replacement, ResponseStage
from kafka_quota_proxy.proxy.stages.throttling import (
    REQUEST_QUOTA_EXEMPT,
    client_of,
    throttle,
)
from kafka_quota_proxy.quota.entities import QuotaKey

# The kinds charged here: their managers looked up in a scope's, their throttles counted.
FETCH_BYTES = QuotaKey.CONSUMER_BYTE_RATE
REQUEST_TIME = QuotaKey.REQUEST_PERCENTAGE


class QuotaSettle(ResponseStage):
    """Charges what the response tells: Fetch and ShareFetch bytes, request time. A streamed
    Fetch is charged from its head: its size is known from the frame's size prefix."""

    streams = True

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine

    def wants(self, ctx: RequestContext) -> bool:
        # Only fetched bytes and request time are charged here: QuotaCharge sets the managers for
        # those alone. Without a request quota a Produce (charged on arrival) or a Metadata
        # response has nothing left to settle.
        charged = ctx.charged
        return charged is not None and charged.managers is not None

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        return self._settle(ctx, body, len(body))

    def on_head(self, ctx: RequestContext, head: memoryview, body_size: int) -> bytes | Replacement | None:
        body = self._settle(ctx, head, body_size)
        if body is None:
            return None
        return Replacement(body.join() if isinstance(body, Pieces) else bytes(body))

    def _settle(self, ctx: RequestContext, body: memoryview, body_size: int) -> bytes | Pieces | None:
        """`body` is the response body, or at least its start (a streamed Fetch)."""
        engine, q = self.engine, _charged_to(ctx)
        user, client_id = client_of(ctx)
        switches, now = engine.settling()
        key = ctx.api_key
        request_throttle = 0
        if key not in REQUEST_QUOTA_EXEMPT and REQUEST_TIME in switches.enabled:
            request_throttle = q.rates[REQUEST_TIME].record_and_get_throttle_ms(
                user, client_id, request_time_ms(ctx, perf_counter()), now, ctx.conn.charge_handles)
        if key == FETCH or (key in FETCHES and _charged_share_fetch(body, ctx.api_version)):
            # FetchResponse.sizeOf and ShareFetchResponse.sizeOf: the body and its 4-byte size
            size = body_size + 4
            deliver = key != FETCH and switches.settings.share_fetch_throttle == "deliver"
            if switches.paced:
                return self._paced(ctx, body, size, request_throttle, deliver, now, switches.enforcing)
            fetch = q.rates[FETCH_BYTES]
            fetch_throttle = fetch.record_and_get_throttle_ms(user, client_id, size, now,
                                                              ctx.conn.charge_handles)
            if fetch_throttle > 0 or request_throttle > 0:
                if deliver and fetch_throttle > 0:
                    # Delivered over the quota: held for its bytes at the quota, not Kafka's
                    # throttle, which lets the consumer through in window-sized bursts.
                    fetch_throttle = fetch.pace_ms(user, client_id, size, now, ctx.conn.charge_handles)
                throttle(engine, ctx, FETCH_BYTES, fetch_throttle, now)
                throttle(engine, ctx, REQUEST_TIME, request_throttle, now)
                if deliver:
                    return None  # delivered, charged, and muted for the throttle (above)
                if switches.enforcing:
                    # Kafka un-records the bytes and sends an empty response in their place,
                    # still carrying max(broker's, proxy's) throttle.
                    fetch.unrecord(user, client_id, size, now)
                    return _empty(ctx, body, now)
                return None
        throttle(engine, ctx, REQUEST_TIME, request_throttle, now)
        return None

    def _paced(self, ctx: RequestContext, body: memoryview, size: int, request_throttle: int,
               deliver: bool, now: int, enforcing: bool) -> bytes | None:
        """`quota.byte_rate_enforcement: paced`: a fetch is delivered when its quota entity's
        pace has come (QuotaCharge held it until then; another connection of the entity may have
        taken the turn meanwhile), charged and paced, and the connection muted until the next
        may come. Otherwise it is answered empty as Kafka answers a throttled fetch, nothing
        charged, muted until the entity's turn: a fetch stays all or nothing (a ShareFetch
        with `share_fetch_throttle: deliver` is always delivered). Over the request quota, as on
        Kafka, it is answered empty too."""
        engine, fetch = self.engine, _charged_to(ctx).rates[FETCH_BYTES]
        user, client_id = client_of(ctx)
        handles = ctx.conn.charge_handles
        wait = 0
        if not deliver and enforcing:
            wait = fetch.paced_wait_ms(user, client_id, now, handles)
        if deliver or not enforcing or not (wait or request_throttle):
            mute = fetch.record_and_get_throttle_ms(user, client_id, size, now, handles, paced=True)
            throttle(engine, ctx, FETCH_BYTES, mute, now)
            throttle(engine, ctx, REQUEST_TIME, request_throttle, now)
            return None
        throttle(engine, ctx, FETCH_BYTES, wait, now)
        throttle(engine, ctx, REQUEST_TIME, request_throttle, now)
        return _empty(ctx, body, now)


def _charged_to(ctx: RequestContext) -> ScopeManagers:
    """The managers QuotaCharge charged the request to: `wants` lets only such a request through."""
    charged = ctx.charged
    assert charged is not None and charged.managers is not None
    return charged.managers


def _empty(ctx: RequestContext, body: memoryview, now: float) -> bytes:
    """Kafka's answer to a throttled fetch in place of `body`: no records, the session kept,
    max(broker's, proxy's) throttle; the topics' bytes taken back."""
    _take_back_topics(ctx, now)
    if ctx.api_key != FETCH:
        head = read_share_fetch_head(body, ctx.api_version)
        return throttled_share_fetch_body(ctx.api_version, max(ctx.throttle_ms, head.throttle_time_ms),
                                          head.error_code, head.acquisition_lock_timeout_ms)
    at = throttle_offset(FETCH, ctx.api_version, body)
    broker_ms = read_throttle(body, at) if at is not None else 0
    return throttled_response_body(ctx.api_version, max(ctx.throttle_ms, broker_ms),
                                   session_id(body, ctx.api_version))


def _charged_share_fetch(body: memoryview, version: int) -> bool:
    """Whether a ShareFetch response is one Kafka charges bytes for: one built from fetched
    records (KafkaApis.processShareFetchResponse), error NONE or INVALID_SHARE_SESSION_EPOCH. Its
    other errors (no such session, not authorized ...) are answered through sendMaybeThrottle,
    which charges the request quota alone."""
    return read_share_fetch_head(body, version).error_code in (NONE, INVALID_SHARE_SESSION_EPOCH)


def _take_back_topics(ctx: RequestContext, now: float) -> None:
    """The topics' bytes of a fetch answered empty for the client's own quota were not
    delivered either: taken back from the topics' rates (TopicFetchSettle or
    TopicShareFetchSettle recorded them)."""
    topics = ctx.topics
    if topics is None:
        return
    counted, managers = topics.bytes, topics.managers
    if not counted:
        return
    if managers is not None:
        for topic, passed, _ in counted:
            if passed:
                managers.topics[FETCH_BYTES].unrecord(topic, passed, now)
    ctx.topic_bytes = [(topic, 0, refused) for topic, _, refused in counted if refused]
