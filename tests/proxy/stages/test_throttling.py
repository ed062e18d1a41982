"""proxy/stages/throttling.py with a real QuotaEngine on a fake clock: `throttle` counts a throttle
in engine.throttles (by sanitized user and client-id, or the user alone for a per-user quota),
tells the usage log, and holds the client (ctx.throttle_ms) only in mode enforce; a throttle of 0
counts nothing. `client_of` is (principal, client-id or ""), `managers` the connection's quota
managers, and the request quota exempts the APIs that come before authentication."""

from __future__ import annotations

import struct

import pytest

from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.throttling import REQUEST_QUOTA_EXEMPT, client_of, managers, throttle
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore
from tests.proxy.conftest import request_frame

NOW = 5_000


class Heard:
    """The usage log's meter: every throttle it is told of."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, int]] = []

    def throttled(self, user: str, client_id: str, quota_type: str, throttle_ms: int) -> None:
        self.calls.append((user, client_id, quota_type, throttle_ms))


def engine(mode: str = "enforce") -> tuple[QuotaEngine, Heard]:
    now = [NOW]
    store = QuotaStore({QuotaEntity(client_id="c"): {QuotaKey.PRODUCER_BYTE_RATE: 1_000_000.0}})
    e = QuotaEngine(QuotaSettings(mode=mode), store, clock=lambda: now[0])  # type: ignore[arg-type]
    heard = Heard()
    e.usage = heard
    return e, heard


def context(principal: str = "alice", client_id: bytes | None = b"c") -> RequestContext:
    frame = request_frame(16, 1, 7, client_id=client_id or b"")
    if client_id is None:  # a null client-id: length -1
        frame = frame[:12] + struct.pack(">h", -1) + frame[14:]
    view = memoryview(frame)
    return RequestContext(parse_request_header(view), view,
                          ConnectionInfo("127.0.0.1:5000", "bootstrap", principal=principal))


def counted(e: QuotaEngine) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    return {k: (r.count, r.total_ms, r.last_ms) for k, r in e.throttles.records.items()}


def test_an_enforced_throttle_is_counted_told_and_holds_the_client() -> None:
    e, heard = engine()
    ctx = context()
    throttle(e, ctx, QuotaKey.PRODUCER_BYTE_RATE, 250, NOW)
    assert counted(e) == {("produce", "alice", "c"): (1, 250, NOW)}
    assert heard.calls == [("alice", "c", "produce", 250)]
    assert ctx.throttle_ms == 250
    # a shorter one: counted, the longer still holds
    throttle(e, ctx, QuotaKey.REQUEST_PERCENTAGE, 100, NOW + 1)
    assert counted(e)[("request", "alice", "c")] == (1, 100, NOW + 1)
    assert ctx.throttle_ms == 250


@pytest.mark.parametrize("mode", ["observe", "off"])
def test_a_throttle_not_enforced_is_counted_and_told_but_holds_nobody(mode: str) -> None:
    e, heard = engine(mode)
    ctx = context()
    throttle(e, ctx, QuotaKey.CONSUMER_BYTE_RATE, 400, NOW)
    assert counted(e) == {("fetch", "alice", "c"): (1, 400, NOW)}
    assert heard.calls == [("alice", "c", "fetch", 400)]
    assert ctx.throttle_ms == 0


def test_no_throttle_counts_nothing() -> None:
    e, heard = engine()
    ctx = context()
    throttle(e, ctx, QuotaKey.PRODUCER_BYTE_RATE, 0, NOW)
    assert counted(e) == {} and heard.calls == [] and ctx.throttle_ms == 0


def test_a_per_user_throttle_is_counted_without_the_client_id() -> None:
    e, heard = engine()
    ctx = context()
    throttle(e, ctx, QuotaKey.PRODUCER_IDS_RATE, 40, NOW, per_user=True)
    assert counted(e) == {("producer_ids", "alice", ""): (1, 40, NOW)}
    assert heard.calls == [("alice", "c", "producer_ids", 40)]  # the usage log still hears it
    assert ctx.throttle_ms == 40


def test_the_user_is_counted_sanitized_and_a_null_client_id_as_empty() -> None:
    e, heard = engine()
    ctx = context(principal="team a", client_id=None)
    assert ctx.header.client_id is None
    assert client_of(ctx) == ("team a", "")
    throttle(e, ctx, QuotaKey.PRODUCER_BYTE_RATE, 10, NOW)
    assert counted(e) == {("produce", "team%20a", ""): (1, 10, NOW)}  # Kafka's Sanitizer
    assert heard.calls == [("team a", "", "produce", 10)]


def test_client_of_is_the_principal_and_the_client_id() -> None:
    assert client_of(context("bob", b"billing")) == ("bob", "billing")
    assert client_of(context("bob", b"")) == ("bob", "")


def test_managers_are_the_connections_scope() -> None:
    e, _ = engine()
    ctx = context()
    with pytest.raises(AssertionError, match="before its broker connection was made"):
        managers(ctx)
    scope = e.scope("127.0.0.1:9092")
    ctx.conn.quotas = scope
    assert managers(ctx) is scope


def test_the_request_quota_exempts_what_comes_before_authentication() -> None:
    assert REQUEST_QUOTA_EXEMPT == frozenset({17, 18, 36})  # SaslHandshake, ApiVersions, SaslAuthenticate
