"""Properties of the ShareFetch readers, the throttled ShareFetch response, the topic walk and the
NodeEndpoints rewrite of ShareFetch and ShareAcknowledge, at every version: fields and record
bytes per topic read back as the codec (Kafka's own message specs) wrote them, unknown tagged
fields in every struct included; damaged or arbitrary bytes raise only ProtocolError."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.api_keys import SHARE_ACKNOWLEDGE, SHARE_FETCH
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.error_codes import INVALID_SHARE_SESSION_EPOCH
from kafka_quota_proxy.protocol.errors import MalformedMessage, ProtocolError
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.rewrite import rewrite_addresses
from kafka_quota_proxy.protocol.share_fetch import (
    ShareFetchTopic,
    read_share_fetch_head,
    read_share_fetch_request,
    share_fetch_topics,
    throttled_share_fetch_body,
)
from tests.support.future import encode_future, future
from tests.support.messages import message
from tests.support.mutations import mutated

REQUEST = codec()[SHARE_FETCH].request
RESPONSE = codec()[SHARE_FETCH].response
VERSIONS = st.integers(1, codec()[SHARE_FETCH].max_version)  # v0 was never released (KIP-932)


def framed(msg: Any, version: int) -> bytes:
    msg.with_header(correlation_id=1, client_id="c")
    return bytes(msg.encode(version=version, header=True, framed=True))


requests = VERSIONS.flatmap(lambda v: st.tuples(st.just(v), message(REQUEST, v)))
responses = VERSIONS.flatmap(lambda v: st.tuples(st.just(v), message(RESPONSE, v)))


@given(requests)
def test_request_fields_read_back(case: tuple[int, Any]) -> None:
    version, msg = case
    frame = memoryview(framed(msg, version))
    info = read_share_fetch_request(frame, parse_request_header(frame).body_offset)
    assert (info.max_wait_ms, info.max_bytes) == (msg.max_wait_ms, msg.max_bytes)
    assert struct.unpack_from(">i", frame, info.max_bytes_at)[0] == msg.max_bytes


@given(responses)
def test_response_head_reads_back(case: tuple[int, Any]) -> None:
    version, msg = case
    head = read_share_fetch_head(memoryview(bytes(msg.encode(version=version))), version)
    assert (head.throttle_time_ms, head.error_code) == (msg.throttle_time_ms, msg.error_code)
    assert head.acquisition_lock_timeout_ms == (msg.acquisition_lock_timeout_ms if version >= 1 else 0)


@st.composite
def damaged_requests(draw: st.DrawFn) -> bytes:
    version, msg = draw(requests)
    return draw(mutated(framed(msg, version)))


@given(damaged_requests())
def test_damaged_requests_raise_only_protocol_errors(frame: bytes) -> None:
    view = memoryview(frame)
    try:
        read_share_fetch_request(view, parse_request_header(view).body_offset)
    except ProtocolError:
        pass


@given(st.binary(max_size=64), VERSIONS)
def test_arbitrary_bodies_raise_only_protocol_errors(body: bytes, version: int) -> None:
    head = framed(REQUEST(version=version, group_id="g", member_id="m"), version)
    at = parse_request_header(memoryview(head)).body_offset
    for reader in (lambda: read_share_fetch_request(memoryview(head[:at] + body), at),
                   lambda: read_share_fetch_head(memoryview(body), version),
                   lambda: share_fetch_topics(memoryview(body), version)):
        try:
            reader()
        except ProtocolError:
            pass


@given(VERSIONS, st.integers(0, 2**31 - 1), st.sampled_from([0, INVALID_SHARE_SESSION_EPOCH]),
       st.integers(-(2**31), 2**31 - 1))
def test_throttled_response_round_trip(version: int, throttle_ms: int, error: int, lock_ms: int) -> None:
    body = throttled_share_fetch_body(version, throttle_ms, error, lock_ms)
    msg = RESPONSE.decode(body, version=version)
    assert (msg.throttle_time_ms, msg.error_code, msg.error_message) == (throttle_ms, error, None)
    assert (msg.responses, msg.node_endpoints) == ([], [])
    assert msg.acquisition_lock_timeout_ms == lock_ms
    head = read_share_fetch_head(memoryview(body), version)
    assert (head.throttle_time_ms, head.error_code, head.acquisition_lock_timeout_ms) == (
        throttle_ms, error, lock_ms)


def test_a_throttled_response_carries_no_other_error() -> None:
    with pytest.raises(MalformedMessage):
        throttled_share_fetch_body(1, 10, 122, 0)


def _proxy_address(node_id: int, host: str, port: int) -> tuple[str, int]:
    return f"proxy-{node_id}.example", 9000 + node_id % 1000


@pytest.mark.parametrize("api_key", [SHARE_FETCH, SHARE_ACKNOWLEDGE])
@given(data=st.data())
def test_node_endpoints_are_rewritten_and_nothing_else(api_key: int, data: st.DataObject) -> None:
    cls = codec()[api_key].response
    version = data.draw(st.integers(1, codec()[api_key].max_version))
    msg = data.draw(message(cls, version))
    body = bytes(msg.encode(version=version))
    out = rewrite_addresses(api_key, version, memoryview(body), _proxy_address)
    if not msg.node_endpoints:
        assert out is None
        return
    assert out is not None
    for n in msg.node_endpoints:  # the same message, the hosts and ports mapped: byte for byte
        n.host, n.port = _proxy_address(n.node_id, n.host, n.port)
    assert (out if isinstance(out, bytes) else out.join()) == bytes(msg.encode(version=version))


@pytest.mark.parametrize("api_key", [SHARE_FETCH, SHARE_ACKNOWLEDGE])
@given(data=st.data())
def test_damaged_responses_raise_only_protocol_errors(api_key: int, data: st.DataObject) -> None:
    cls = codec()[api_key].response
    version = data.draw(st.integers(1, codec()[api_key].max_version))
    body = data.draw(mutated(bytes(data.draw(message(cls, version)).encode(version=version))))
    try:
        rewrite_addresses(api_key, version, memoryview(body), _proxy_address)
    except ProtocolError:
        pass


def _expected_topics(msg: Any) -> list[ShareFetchTopic]:
    return [ShareFetchTopic(t.topic_id.bytes, sum(len(p.records or b"") for p in t.partitions))
            for t in msg.responses]


@given(responses)
def test_topic_bytes_read_back(case: tuple[int, Any]) -> None:
    version, msg = case
    body = memoryview(bytes(msg.encode(version=version)))
    assert share_fetch_topics(body, version) == _expected_topics(msg)


@given(VERSIONS.flatmap(lambda v: st.tuples(st.just(v), message(future(RESPONSE), v))))
def test_topic_bytes_read_back_past_unknown_tagged_fields(case: tuple[int, Any]) -> None:
    """Tagged fields of a newer Kafka, in every struct (the partitions' and topics' included)."""
    version, msg = case
    body = memoryview(encode_future(msg, version))
    assert share_fetch_topics(body, version) == _expected_topics(msg)


@given(responses.flatmap(lambda case: mutated(bytes(case[1].encode(version=case[0]))).map(
    lambda body: (case[0], body))))
def test_damaged_responses_walk_or_raise_only_protocol_errors(case: tuple[int, bytes]) -> None:
    version, body = case
    try:
        topics = share_fetch_topics(memoryview(body), version)
    except ProtocolError:
        return
    assert all(len(t.topic_id) == 16 and 0 <= t.size <= len(body) for t in topics)
