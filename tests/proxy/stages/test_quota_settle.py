"""QuotaSettle (proxy/stages/quota_settle.py), called directly with a real QuotaEngine on a fake
clock: it wants a response only where QuotaCharge left the managers to charge; it charges a Fetch
response's size (body + 4, Kafka's FetchResponse.sizeOf) to the consumer byte rate, and one over
the quota is answered as Kafka answers it in mode enforce (KIP-219: the bytes taken back, an
empty response with the throttle and the session kept), whole or streamed from its head; in mode
observe it is delivered and counted; the request quota charges the request's time, its throttle
bounded to one window."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.protocol.api_keys import FETCH, PRODUCE
from kafka_quota_proxy.protocol.fetch import throttled_response_body
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages import quota_settle
from kafka_quota_proxy.proxy.stages.base import Replacement
from kafka_quota_proxy.proxy.stages.quota_settle import QuotaSettle
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore
from tests.proxy.conftest import request_frame
from tests.proxy.quota_support import (
    SESSION,
    fetch_response,
    kafka_throttle,
    produce_response,
    records_for_fetch_size,
)
from tests.support.managers import fetch_bytes, request_time

NOW = 5_000
BROKER = "b1:9092"
QUOTA = 1_000  # consumer_byte_rate, B/s


def engine(quotas: dict[QuotaKey, float], mode: str = "enforce") -> QuotaEngine:
    store = QuotaStore({QuotaEntity(client_id="c"): quotas})
    return QuotaEngine(QuotaSettings(mode=mode), store, clock=lambda: NOW)  # type: ignore[arg-type]


def request(e: QuotaEngine, api_key: int, version: int, charged: bool = True) -> RequestContext:
    frame = memoryview(request_frame(api_key, version, 7, client_id=b"c"))
    ctx = RequestContext(parse_request_header(frame), frame,
                         ConnectionInfo("127.0.0.1:5000", "bootstrap", principal="alice"))
    ctx.conn.quotas = e.scope(BROKER)
    ctx.fetch_max_wait_ms = 500 if api_key == FETCH else 0
    if charged:  # as QuotaCharge leaves a request whose response is charged
        ctx.charge().managers = ctx.conn.quotas
    return ctx


def fetched(size: int) -> memoryview:
    """A Fetch v11 response whose quota size is `size`."""
    return memoryview(fetch_response(11, 0, records_for_fetch_size(11, size)))


def fetch_rate(e: QuotaEngine) -> float:
    return fetch_bytes(e.scope(BROKER)).measure("alice", "c", NOW)


def throttles(e: QuotaEngine) -> dict[tuple[str, str, str], tuple[int, int]]:
    return {k: (r.count, r.total_ms) for k, r in e.throttles.records.items()}


def test_it_wants_only_a_response_left_to_charge() -> None:
    e = engine({QuotaKey.CONSUMER_BYTE_RATE: QUOTA})
    stage = QuotaSettle(e)
    assert stage.wants(request(e, FETCH, 11)) is True
    assert stage.wants(request(e, FETCH, 11, charged=False)) is False
    uncharged = request(e, FETCH, 11, charged=False)
    uncharged.charge()  # charged, but nothing left for the response (a Produce's bytes)
    assert stage.wants(uncharged) is False
    assert stage.streams is True


def test_a_fetch_within_the_quota_is_charged_its_size_and_left_alone() -> None:
    e = engine({QuotaKey.CONSUMER_BYTE_RATE: QUOTA})
    ctx = request(e, FETCH, 11)
    assert QuotaSettle(e).on_response(ctx, fetched(5_000)) is None
    assert fetch_rate(e) == 500.0  # a new sensor's rate spans (11 - 1) windows of 1 s
    assert ctx.throttle_ms == 0 and throttles(e) == {}


def test_a_fetch_over_the_quota_is_answered_empty_with_kafkas_throttle_and_its_bytes_taken_back() -> None:
    e = engine({QuotaKey.CONSUMER_BYTE_RATE: QUOTA})
    stage = QuotaSettle(e)
    stage.on_response(request(e, FETCH, 11), fetched(5_000))
    ctx = request(e, FETCH, 11)
    answer = stage.on_response(ctx, fetched(10_000))
    throttle_ms = kafka_throttle(1_500, QUOTA)  # 15,000 B over 10 s against 1,000 B/s
    assert throttle_ms == 5_000
    assert answer == throttled_response_body(11, throttle_ms, SESSION)
    assert ctx.throttle_ms == throttle_ms
    assert fetch_rate(e) == 500.0  # taken back, as Kafka un-records a throttled fetch
    assert throttles(e) == {("fetch", "alice", "c"): (1, throttle_ms)}


def test_a_streamed_fetch_over_the_quota_is_replaced_from_its_head() -> None:
    e = engine({QuotaKey.CONSUMER_BYTE_RATE: QUOTA})
    body = fetched(20_000)
    ctx = request(e, FETCH, 11)
    # the head only: the size comes from the frame's size prefix (body_size)
    answer = QuotaSettle(e).on_head(ctx, body[:64], len(body))
    throttle_ms = kafka_throttle(2_000, QUOTA)
    assert isinstance(answer, Replacement)
    assert answer.body == throttled_response_body(11, throttle_ms, SESSION)
    assert fetch_rate(e) == 0.0


def test_in_mode_observe_a_fetch_over_the_quota_is_delivered_and_counted() -> None:
    e = engine({QuotaKey.CONSUMER_BYTE_RATE: QUOTA}, mode="observe")
    ctx = request(e, FETCH, 11)
    assert QuotaSettle(e).on_response(ctx, fetched(20_000)) is None
    assert ctx.throttle_ms == 0
    assert fetch_rate(e) == 2_000.0
    assert throttles(e) == {("fetch", "alice", "c"): (1, kafka_throttle(2_000, QUOTA))}


def test_the_request_quota_charges_the_requests_time_its_throttle_bounded_to_a_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    e = engine({QuotaKey.REQUEST_PERCENTAGE: 1.0})
    monkeypatch.setattr(quota_settle, "perf_counter", lambda: 100.0)
    ctx = request(e, PRODUCE, 7)
    # read at 99.0, forwarded at 99.1, answered at 99.3, settled at 100.0: 0.1 + 0.7 s of the
    # proxy's and 0.2 s at the broker (acks 1, not waiting by design): 1,000 ms
    ctx.times.received, ctx.times.sent, ctx.times.answered = 99.0, 99.1, 99.3
    assert QuotaSettle(e).on_response(ctx, memoryview(produce_response(7, 0))) is None
    request_rate = request_time(e.scope(BROKER)).measure("alice", "c", NOW)
    assert request_rate == pytest.approx(10.0)  # 100 percent-seconds over 10 s: 10% of a thread
    # Kafka's throttle would be (10 - 1) / 1 x 10 s; the request quota bounds it to one window
    assert kafka_throttle(10.0, 1.0) > 1_000
    assert ctx.throttle_ms == 1_000
    assert throttles(e) == {("request", "alice", "c"): (1, 1_000)}
