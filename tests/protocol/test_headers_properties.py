"""Properties of the request and response header readers: every field read back as written, at
every API and version the codec knows; arbitrary or damaged bytes raise only ProtocolError."""

from __future__ import annotations

import struct

from hypothesis import example, given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.api_keys import API_VERSIONS, REFUSED
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import (
    frame_request,
    parse_request_header,
    response_body_offset,
    response_correlation_id,
)
from tests.support.encoding import uvarint
from tests.support.messages import message
from tests.support.mutations import mutated

INT32 = st.integers(-(2**31), 2**31 - 1)
# Every key the codec frames but those the proxy refuses (parse_request_header refuses them).
api_versions = st.sampled_from(sorted(set(codec()) - set(REFUSED))).flatmap(
    lambda key: st.tuples(st.just(key), st.integers(0, codec()[key].max_version)))
client_ids = st.none() | st.text(max_size=30)
# A tagged-field section as a client may send it: (tag, value) pairs, tags in any order.
tag_sections = st.lists(st.tuples(st.integers(0, 2**31 - 1), st.binary(max_size=140)), max_size=3)


def tagged(fields: list[tuple[int, bytes]]) -> bytes:
    return uvarint(len(fields)) + b"".join(uvarint(t) + uvarint(len(v)) + v for t, v in fields)


def request_frame(key: int, version: int, corr: int, client_id: str | None,
                  tags: list[tuple[int, bytes]] | None, body: bytes) -> tuple[bytes, int]:
    """A request frame, written here independently of the code under test; and its body offset.
    Header tags (tags not None) go in where the version is flexible."""
    raw = None if client_id is None else client_id.encode()
    header = struct.pack(">hhi", key, version, corr)
    header += struct.pack(">h", -1) if raw is None else struct.pack(">h", len(raw)) + raw
    if tags is not None and codec()[key].is_flexible(version):
        header += tagged(tags)
    return struct.pack(">i", len(header) + len(body)) + header + body, 4 + len(header)


@given(api_versions, INT32, client_ids, tag_sections, st.binary(max_size=64))
def test_request_header_round_trip(api: tuple[int, int], corr: int, client_id: str | None,
                                   tags: list[tuple[int, bytes]], body: bytes) -> None:
    key, version = api
    frame, body_at = request_frame(key, version, corr, client_id, tags, body)
    header = parse_request_header(memoryview(frame))
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        key, version, corr, client_id)
    assert header.body_offset == body_at and frame[header.body_offset:] == body
    assert header.spec is codec()[key]


@given(api_versions, INT32, client_ids, st.data())
def test_request_header_of_kafka_python_requests(api: tuple[int, int], corr: int,
                                                 client_id: str | None, data: st.DataObject) -> None:
    key, version = api
    spec = codec()[key]
    # Every field drawn: kafka-python has no default for a struct field (StreamsGroup APIs').
    msg = data.draw(message(spec.request, version))
    frame = frame_request(msg, version, corr, client_id)
    header = parse_request_header(memoryview(frame))
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        key, version, corr, client_id)
    assert frame[header.body_offset:] == bytes(msg.encode(version=version))


@given(st.integers(codec()[API_VERSIONS].max_version + 1, 2**15 - 1), INT32, client_ids,
       st.binary(max_size=16))
def test_api_versions_newer_than_the_codec_is_read_without_a_spec(version: int, corr: int,
                                                                  client_id: str | None, body: bytes) -> None:
    # The header's tags are not read (the layout of an unknown version is unknown): they are
    # the body's first bytes, which the proxy answers with UNSUPPORTED_VERSION anyway.
    frame, body_at = request_frame(API_VERSIONS, version, corr, client_id, None, body)
    header = parse_request_header(memoryview(frame))
    assert header.spec is None and header.api_version == version and header.correlation_id == corr
    assert header.body_offset == body_at


@st.composite
def damaged_requests(draw: st.DrawFn) -> bytes:
    key, version = draw(api_versions)
    frame, _ = request_frame(key, version, draw(INT32), draw(client_ids), draw(tag_sections),
                             draw(st.binary(max_size=16)))
    return draw(mutated(frame))


@given(st.binary(max_size=80) | damaged_requests())
@example(b"\x00\x00\x00\x08\x00\x12\x00\x03\x00\x00\x00\x01")  # ApiVersions v3, no client_id length
@example(b"\x00\x00\x00\x0b\x00\x03\x00\x0c\x00\x00\x00\x01\xff\xff\x80")  # header tags cut in a varint
def test_arbitrary_request_bytes_raise_only_protocol_errors(frame: bytes) -> None:
    try:
        header = parse_request_header(memoryview(frame))
    except ProtocolError:
        return
    assert 12 <= header.body_offset <= len(frame)


@given(INT32, st.booleans(), tag_sections, st.binary(max_size=64))
def test_response_header_round_trip(corr: int, flexible: bool, tags: list[tuple[int, bytes]],
                                    body: bytes) -> None:
    header = struct.pack(">i", corr) + (tagged(tags) if flexible else b"")
    frame = struct.pack(">i", len(header) + len(body)) + header + body
    assert response_correlation_id(frame) == corr
    at = response_body_offset(memoryview(frame), 1 if flexible else 0)
    assert frame[at:] == body


@given(st.binary(max_size=40), st.integers(0, 1))
def test_arbitrary_response_bytes_raise_only_protocol_errors(frame: bytes, header_version: int) -> None:
    try:
        response_correlation_id(frame)
        at = response_body_offset(memoryview(frame), header_version)
    except ProtocolError:
        return
    assert 8 <= at <= len(frame)
