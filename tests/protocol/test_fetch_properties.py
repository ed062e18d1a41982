"""Properties of the Fetch readers and of the throttled Fetch response, at every version: fields
read back as kafka-python wrote them; damaged or arbitrary bytes raise only ProtocolError."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.fetch import read_fetch_request, session_id, throttled_response_body
from kafka_quota_proxy.protocol.headers import parse_request_header
from tests.support.messages import message
from tests.support.mutations import mutated

REQUEST_VERSIONS = st.integers(0, FetchRequest.max_version)
RESPONSE_VERSIONS = st.integers(0, FetchResponse.max_version)


def framed(msg: Any, version: int) -> bytes:
    msg.with_header(correlation_id=1, client_id="c")
    return bytes(msg.encode(version=version, header=True, framed=True))


requests = REQUEST_VERSIONS.flatmap(lambda v: st.tuples(st.just(v), message(FetchRequest, v)))


@given(requests)
def test_request_fields_read_back(case: tuple[int, Any]) -> None:
    version, msg = case
    frame = memoryview(framed(msg, version))
    info = read_fetch_request(frame, parse_request_header(frame).body_offset, version)
    if version < 15:
        replica_id = msg.replica_id
    else:  # v15+: in the tagged ReplicaState, when the client sent one
        replica_id = msg.replica_state.replica_id if "replica_state" in (msg.tags or ()) else -1
    assert (info.replica_id, info.max_wait_ms) == (replica_id, msg.max_wait_ms)
    if version >= 3:
        assert info.max_bytes == msg.max_bytes
        assert info.max_bytes_at is not None
        assert struct.unpack_from(">i", frame, info.max_bytes_at)[0] == msg.max_bytes
    else:
        assert info.max_bytes is None and info.max_bytes_at is None


@st.composite
def damaged_requests(draw: st.DrawFn) -> tuple[bytes, int]:
    version, msg = draw(requests)
    return draw(mutated(framed(msg, version))), version


def read_request(frame: bytes, version: int) -> None:
    view = memoryview(frame)
    try:
        at = parse_request_header(view).body_offset
    except ProtocolError:
        at = min(len(frame), 14)
    try:
        read_fetch_request(view, at, version)
    except ProtocolError:
        pass


REPLICA_STATE_EMPTY = (  # Fetch v15 whose tagged ReplicaState (tag 1) is 0 bytes long
    b"\x00\x00\x00'\x00\x01\x00\x0f\x00\x00\x00\x01\x00\x01c\x00\x00\x00\x00\x00\x00\x00\x00\x00\x7f"
    b"\xff\xff\xff\x00\x00\x00\x00\x00\xff\xff\xff\xff\x01\x01\x01\x01\x01\x00")


@given(damaged_requests())
@example((REPLICA_STATE_EMPTY, 15))  # leaked struct.error: the tag's value was read past its end
def test_damaged_requests_raise_only_protocol_errors(case: tuple[bytes, int]) -> None:
    read_request(*case)


@given(st.binary(max_size=120), REQUEST_VERSIONS)
def test_arbitrary_request_bodies_raise_only_protocol_errors(body: bytes, version: int) -> None:
    head = framed(FetchRequest(version=version), version)
    at = parse_request_header(memoryview(head)).body_offset
    read_request(head[:at] + body, version)


@given(RESPONSE_VERSIONS, st.integers(0, 2**31 - 1), st.integers(-(2**31), 2**31 - 1))
def test_throttled_response_round_trip(version: int, throttle_ms: int, session: int) -> None:
    body = throttled_response_body(version, throttle_ms, session)
    msg = FetchResponse.decode(body, version=version)
    assert msg.responses == []
    if version >= 1:
        assert msg.throttle_time_ms == throttle_ms
    if version >= 7:
        assert (msg.error_code, msg.session_id) == (0, session)
        assert session_id(memoryview(body), version) == session
    else:
        assert session_id(memoryview(body), version) == 0


@given(st.binary(max_size=16), RESPONSE_VERSIONS)
@example(b"", 7)  # leaked struct.error before session_id checked the body's length
def test_session_id_of_arbitrary_bodies_raises_only_protocol_errors(body: bytes, version: int) -> None:
    try:
        session_id(memoryview(body), version)
    except ProtocolError:
        pass
