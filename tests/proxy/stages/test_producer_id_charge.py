"""ProducerIdCharge (proxy/stages/producer_ids.py), called directly with a real QuotaEngine on a
fake clock. Producer-id windows of 11 x 1 s, so a fresh window is 10 s and 0.5 ids/s lets 5 new ids
through; the 6th is over by (0.6 - 0.5) / 0.5 * 10 s = 2000 ms, throttled, or refused unforwarded
with the `reject` action (THROTTLING_QUOTA_EXCEEDED on every partition, nothing counted). It asks
only for Produce, and does nothing while no producer_ids_rate is set, in mode off, or for the
exempt."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer.produce import ProduceResponse

from kafka_quota_proxy.config.quota_settings import ProducerIdSettings, QuotaSettings
from kafka_quota_proxy.protocol.api_keys import PRODUCE
from kafka_quota_proxy.protocol.error_codes import THROTTLING_QUOTA_EXCEEDED
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.base import Reply
from kafka_quota_proxy.proxy.stages.producer_ids import PRODUCER_ID_REFUSAL, ProducerIdCharge
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore
from tests.proxy.conftest import request_frame
from tests.proxy.stages.test_producer_id_quota import produce
from tests.support.managers import producer_id_rate

NOW = 5_000
BROKER = "b1:9092"


def engine(action: str = "throttle", mode: str = "enforce", quota: bool = True,
           **settings: Any) -> QuotaEngine:
    quotas = {QuotaEntity(user=DEFAULT): {QuotaKey.PRODUCER_IDS_RATE: 0.5}} if quota else {}
    ids = ProducerIdSettings(action=action, window_size_seconds=1)
    return QuotaEngine(QuotaSettings(mode=mode, producer_ids=ids, **settings),  # type: ignore[arg-type]
                       QuotaStore(quotas), clock=lambda: NOW)


def producing(e: QuotaEngine, pids: list[int | None], acks: int = 1) -> RequestContext:
    body = bytes(produce(pids, acks=acks).encode(version=9))
    frame = memoryview(request_frame(PRODUCE, 9, 7, body, client_id=b"c", flexible=True))
    ctx = RequestContext(parse_request_header(frame), frame,
                         ConnectionInfo("127.0.0.1:5000", "bootstrap", principal="alice"))
    ctx.acks = acks
    ctx.conn.quotas = e.scope(BROKER)
    return ctx


def throttles(e: QuotaEngine) -> dict[tuple[str, str, str], tuple[int, int]]:
    return {k: (r.count, r.total_ms) for k, r in e.throttles.records.items()}


def test_it_asks_for_produce_alone_and_refuses_with_kip_599s_error() -> None:
    assert ProducerIdCharge(engine()).api_keys == frozenset({PRODUCE})
    assert PRODUCER_ID_REFUSAL == THROTTLING_QUOTA_EXCEEDED


def test_new_ids_are_counted_for_the_user_and_the_one_over_the_rate_throttled() -> None:
    e = engine()
    stage = ProducerIdCharge(e)
    first = producing(e, [1, 2, 3, 4, 5])
    assert stage.on_request(first) is None
    assert first.charged is not None and first.charged.new_producer_ids == 5
    assert first.throttle_ms == 0
    again = producing(e, [1, 2])  # seen: not new
    assert stage.on_request(again) is None and again.charged is not None
    assert again.charged.new_producer_ids == 0
    over = producing(e, [6])
    assert stage.on_request(over) is None  # throttled, forwarded
    assert over.throttle_ms == 2_000
    assert throttles(e) == {("producer_ids", "alice", ""): (1, 2_000)}  # the user's, no client-id
    assert producer_id_rate(e.scope(BROKER)).measure("alice", NOW) == 0.6


def test_with_reject_the_one_over_is_refused_unforwarded_and_not_counted() -> None:
    e = engine(action="reject")
    stage = ProducerIdCharge(e)
    assert stage.on_request(producing(e, [1, 2, 3, 4, 5])) is None
    over = producing(e, [6])
    reply = stage.on_request(over)
    assert isinstance(reply, Reply) and reply.body is not None
    answer: Any = ProduceResponse.decode(reply.body, version=9)  # type: ignore[attr-defined]
    errors = [(t.name, [(p.index, p.error_code) for p in t.partition_responses]) for t in answer.responses]
    assert (answer.throttle_time_ms, errors) == (2_000, [("orders", [(0, THROTTLING_QUOTA_EXCEEDED)])])
    assert over.charged is not None and over.charged.new_producer_ids == 0
    assert producer_id_rate(e.scope(BROKER)).measure("alice", NOW) == 0.5
    # acks=0: nothing to answer; dropped, the connection muted for the throttle
    dropped = producing(e, [7], acks=0)
    assert stage.on_request(dropped) == Reply(None) and dropped.throttle_ms == 2_000


def test_nothing_is_read_without_a_producer_ids_rate_in_mode_off_or_for_the_exempt() -> None:
    for e in (engine(quota=False), engine(mode="off"), engine(exempt_principals=frozenset({"alice"}))):
        ctx = producing(e, [1, 2, 3, 4, 5, 6])
        assert ProducerIdCharge(e).on_request(ctx) is None
        assert ctx.charged is None and ctx.throttle_ms == 0 and throttles(e) == {}
    observing = engine(action="reject", mode="observe")
    stage = ProducerIdCharge(observing)
    over = producing(observing, [1, 2, 3, 4, 5, 6])
    assert stage.on_request(over) is None  # observe: counted, never refused
    assert throttles(observing) == {("producer_ids", "alice", ""): (1, 2_000)}
