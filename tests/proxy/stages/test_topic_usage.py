"""The usage log's bytes per topic (proxy/stages/topic_usage.py), called directly. ProduceTopicBytes
leaves in ctx.topic_bytes each Produce topic's record bytes, (topic, bytes, 0), in the request's
order; FetchTopicBytes each Fetch or ShareFetch response topic's that carries any. A topic named
by an id no Metadata has named (Leadership) is left out; a request a topic quota stage already
measured (ctx.topic_bytes set) is not walked again; a body that does not parse records nothing;
and neither stage changes the request or the response."""

from __future__ import annotations

import struct
import uuid

import pytest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.producer.produce import ProduceRequest

from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.stages.topic_usage import FetchTopicBytes, ProduceTopicBytes
from kafka_quota_proxy.quota.topics import Leadership
from tests.proxy.conftest import request_frame
from tests.proxy.quota_support import share_fetch_response

PRODUCE, FETCH, SHARE_FETCH = 0, 1, 78
ORDERS_ID, AUDIT_ID, UNNAMED_ID = uuid.UUID(int=7), uuid.UUID(int=8), uuid.UUID(int=9)

# (topic name, topic id, record bytes of each partition; None: a null records field)
Topics = list[tuple[str, uuid.UUID, list[int | None]]]
TOPICS: Topics = [("orders", ORDERS_ID, [100, 30]), ("audit", AUDIT_ID, [7]), ("unnamed", UNNAMED_ID, [5])]


def leadership() -> Leadership:
    """What Metadata has said: the ids of orders and audit, not of unnamed."""
    known = Leadership()
    known.observe("orders", ["b1"], ORDERS_ID.bytes)
    known.observe("audit", ["b1"], AUDIT_ID.bytes)
    return known


def context(frame: bytes) -> RequestContext:
    view = memoryview(frame)
    return RequestContext(parse_request_header(view), view, ConnectionInfo("127.0.0.1:5000", "bootstrap"))


def records(size: int | None) -> bytes | None:
    return None if size is None else b"r" * size


def produce_frame(version: int, topics: Topics) -> bytes:
    t = ProduceRequest.TopicProduceData
    data = [t(**({"topic_id": topic_id} if version >= 13 else {"name": name}), partition_data=[
        t.PartitionProduceData(index=i, records=records(size)) for i, size in enumerate(sizes)])
        for name, topic_id, sizes in topics]
    return frame_request(ProduceRequest(transactional_id=None, acks=1, timeout_ms=1000, topic_data=data),
                         version, 7, "c")


def fetch_body(version: int, topics: Topics) -> bytes:
    t = FetchResponse.FetchableTopicResponse
    return bytes(FetchResponse(version=version, throttle_time_ms=0, error_code=0, session_id=0, responses=[
        t(topic=name, topic_id=topic_id, partitions=[
            t.PartitionData(partition_index=i, error_code=0, high_watermark=100, last_stable_offset=100,
                            log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1,
                            records=records(size)) for i, size in enumerate(sizes)])
        for name, topic_id, sizes in topics]).encode(version=version))


def fetch_context(version: int, key: int = FETCH) -> RequestContext:
    return context(request_frame(key, version, 7, flexible=version >= 12 or key == SHARE_FETCH))


# --- Produce --------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [3, 9])
def test_a_produce_by_name_records_each_topics_record_bytes(version: int) -> None:
    stage = ProduceTopicBytes(Leadership())  # names need no Metadata
    assert stage.api_keys == frozenset({PRODUCE})
    ctx = context(produce_frame(version, TOPICS))
    assert stage.on_request(ctx) is None
    assert ctx.topic_bytes == [("orders", 130, 0), ("audit", 7, 0), ("unnamed", 5, 0)]
    assert ctx.rewrite is None  # the request goes on as it came


def test_a_produce_by_id_records_the_topics_metadata_named() -> None:
    ctx = context(produce_frame(13, TOPICS))
    ProduceTopicBytes(leadership()).on_request(ctx)
    assert ctx.topic_bytes == [("orders", 130, 0), ("audit", 7, 0)]


def test_null_records_count_nothing_and_a_topic_with_none_is_still_listed() -> None:
    ctx = context(produce_frame(9, [("orders", ORDERS_ID, [None, 12]), ("audit", AUDIT_ID, [None])]))
    ProduceTopicBytes(Leadership()).on_request(ctx)
    assert ctx.topic_bytes == [("orders", 12, 0), ("audit", 0, 0)]


def test_a_produce_a_topic_quota_measured_is_not_walked_again() -> None:
    ctx = context(produce_frame(9, TOPICS))
    measured = [("orders", 100, 30)]
    ctx.topic_bytes = measured
    ProduceTopicBytes(Leadership()).on_request(ctx)
    assert ctx.topic_bytes is measured and measured == [("orders", 100, 30)]


def test_a_produce_that_does_not_parse_records_nothing() -> None:
    ctx = context(request_frame(PRODUCE, 3, 7, struct.pack(">hhii", -1, 1, 1000, 0x7FFFFFFF)))
    assert ProduceTopicBytes(Leadership()).on_request(ctx) is None
    assert ctx.topic_bytes is None


# --- Fetch and ShareFetch responses ---------------------------------------------------------------

@pytest.mark.parametrize("version", [4, 12])
def test_a_fetch_response_by_name_records_the_topics_with_bytes(version: int) -> None:
    stage = FetchTopicBytes(Leadership())
    assert stage.api_keys == frozenset({FETCH, SHARE_FETCH})
    ctx = fetch_context(version)
    topics = [*TOPICS, ("idle", AUDIT_ID, [0, None])]
    assert stage.wants(ctx) is True
    assert stage.on_response(ctx, memoryview(fetch_body(version, topics))) is None
    # a topic that brought no bytes is left out
    assert ctx.topic_bytes == [("orders", 130, 0), ("audit", 7, 0), ("unnamed", 5, 0)]


def test_a_fetch_response_by_id_records_the_topics_metadata_named() -> None:
    ctx = fetch_context(16)
    FetchTopicBytes(leadership()).on_response(ctx, memoryview(fetch_body(16, TOPICS)))
    assert ctx.topic_bytes == [("orders", 130, 0), ("audit", 7, 0)]


def test_a_fetch_response_is_read_in_the_version_the_broker_answered_in() -> None:
    ctx = fetch_context(13)
    ctx.forward_as(12)  # a stage lowered the request: the answer names topics, as v12 does
    FetchTopicBytes(Leadership()).on_response(ctx, memoryview(fetch_body(12, TOPICS)))
    assert ctx.topic_bytes == [("orders", 130, 0), ("audit", 7, 0), ("unnamed", 5, 0)]


def test_a_share_fetch_response_records_its_topics_by_their_ids() -> None:
    stage = FetchTopicBytes(leadership())
    ctx = fetch_context(1, SHARE_FETCH)
    stage.on_response(ctx, memoryview(share_fetch_response(1, 0, b"r" * 64)))  # topic ORDERS_ID
    assert ctx.topic_bytes == [("orders", 64, 0)]
    empty = fetch_context(1, SHARE_FETCH)
    stage.on_response(empty, memoryview(share_fetch_response(1, 0, b"")))
    assert empty.topic_bytes == []
    unknown = fetch_context(1, SHARE_FETCH)
    FetchTopicBytes(Leadership()).on_response(unknown, memoryview(share_fetch_response(1, 0, b"r" * 64)))
    assert unknown.topic_bytes == []


def test_a_fetch_a_topic_quota_measured_is_not_wanted() -> None:
    ctx = fetch_context(12)
    ctx.topic_bytes = [("orders", 100, 30)]
    assert FetchTopicBytes(Leadership()).wants(ctx) is False


def test_a_fetch_response_that_does_not_parse_records_nothing() -> None:
    ctx = fetch_context(12)
    whole = fetch_body(12, TOPICS)
    assert FetchTopicBytes(Leadership()).on_response(ctx, memoryview(whole[:-20])) is None
    assert ctx.topic_bytes is None
