"""Request and response headers, read from a whole frame (size prefix included)."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.api_header import RequestHeader as KafkaRequestHeader
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

from kafka_quota_proxy.protocol.api_keys import API_VERSIONS, METADATA, REFUSED
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import (
    MalformedMessage,
    ProtocolError,
    TruncatedMessage,
    UnknownApiKey,
    UnsupportedApiVersion,
)
from kafka_quota_proxy.protocol.headers import (
    frame_response,
    parse_request_header,
    response_body_offset,
    response_correlation_id,
)


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def framed(payload: bytes) -> memoryview:
    return memoryview(i32(len(payload)) + payload)


def raw_header(api_key: int, version: int, correlation_id: int, client_id: bytes | None,
               tags: bytes | None = None) -> bytes:
    """A request header built by hand; `tags` is the whole tagged-field section (v2) or None (v1)."""
    cid = i16(-1) if client_id is None else i16(len(client_id)) + client_id
    return i16(api_key) + i16(version) + i32(correlation_id) + cid + (tags if tags is not None else b"")


def metadata_request(version: int, client_id: str | None, correlation_id: int = 42) -> tuple[bytes, bytes]:
    """(framed request with header, body alone), both encoded by kafka-python."""
    req = MetadataRequest(version=version, topics=[MetadataRequest.MetadataRequestTopic(name="orders")],
                          allow_auto_topic_creation=False)
    body = bytes(req.encode(version=version))
    req.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(req.encode(version=version, header=True, framed=True)), body


# --- requests built by kafka-python -------------------------------------------------------------


def test_non_flexible_request_header() -> None:
    frame, body = metadata_request(1, "client-1")
    h = parse_request_header(memoryview(frame))
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (3, 1, 42, "client-1")
    assert h.body_offset == 4 + 2 + 2 + 4 + 2 + len("client-1")
    assert frame[h.body_offset :] == body
    assert h.spec is codec()[METADATA]


def test_flexible_request_header_without_tags() -> None:
    frame, body = metadata_request(12, "client-1")
    h = parse_request_header(memoryview(frame))
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (3, 12, 42, "client-1")
    # client_id stays an int16-length string in header v2; one byte of empty tagged fields follows.
    assert frame[14:22] == b"client-1"
    assert frame[22] == 0
    assert h.body_offset == 4 + 2 + 2 + 4 + 2 + len("client-1") + 1
    assert frame[h.body_offset :] == body


def test_flexible_request_header_with_tagged_fields() -> None:
    _, body = metadata_request(12, "c")
    big = bytes(range(200))  # its length needs a two-byte varint
    tags = b"\x03" + b"\x00\x03abc" + b"\x05\x00" + b"\x7f\xc8\x01" + big
    payload = raw_header(3, 12, 7, b"c", tags) + body
    h = parse_request_header(framed(payload))
    assert h.client_id == "c"
    assert h.correlation_id == 7
    assert h.body_offset == 4 + 2 + 2 + 4 + 2 + 1 + len(tags)
    assert bytes(framed(payload)[h.body_offset :]) == body


def test_tags_are_not_skipped_for_a_non_flexible_version() -> None:
    # The same bytes at v8 are header v1: what would be a tag section is the body's first byte.
    payload = raw_header(3, 8, 7, b"c", b"\x00") + b"body"
    frame = framed(payload)
    h = parse_request_header(frame)
    assert h.body_offset == 4 + 2 + 2 + 4 + 2 + 1
    assert bytes(frame[h.body_offset :]) == b"\x00body"


def test_null_client_id() -> None:
    frame, body = metadata_request(1, None)
    assert frame[12:14] == b"\xff\xff"
    h = parse_request_header(memoryview(frame))
    assert h.client_id is None
    assert h.body_offset == 14
    assert frame[14:] == body


def test_null_client_id_flexible() -> None:
    frame, body = metadata_request(12, None)
    h = parse_request_header(memoryview(frame))
    assert h.client_id is None
    assert h.body_offset == 15
    assert frame[15:] == body


def test_empty_client_id() -> None:
    frame, body = metadata_request(4, "")
    h = parse_request_header(memoryview(frame))
    assert h.client_id == ""
    assert h.body_offset == 14
    assert frame[14:] == body


def test_utf8_client_id() -> None:
    cid = "клиент-ü-🚀"
    frame, body = metadata_request(12, cid)
    h = parse_request_header(memoryview(frame))
    assert h.client_id == cid
    assert h.body_offset == 14 + len(cid.encode("utf-8")) + 1
    assert len(cid.encode("utf-8")) != len(cid)
    assert frame[h.body_offset :] == body


def test_client_id_that_is_not_utf8() -> None:
    with pytest.raises(MalformedMessage):
        parse_request_header(framed(raw_header(3, 1, 1, b"\xff\xfe")))


@pytest.mark.parametrize("length", [-2, -100, -32768])
def test_bad_client_id_length(length: int) -> None:
    payload = i16(3) + i16(1) + i32(1) + i16(length) + b"x" * 10
    with pytest.raises(MalformedMessage) as exc:
        parse_request_header(framed(payload))
    assert exc.value.kind == "malformed"


def test_correlation_id_extremes() -> None:
    for cid in (0, -1, 2**31 - 1, -(2**31)):
        h = parse_request_header(framed(raw_header(3, 1, cid, b"x")))
        assert h.correlation_id == cid


def test_body_offset_is_relative_to_the_frame_and_body_may_be_empty() -> None:
    h = parse_request_header(framed(raw_header(3, 1, 9, b"abc")))
    assert h.body_offset == 17
    h = parse_request_header(framed(raw_header(3, 12, 9, b"abc", b"\x00")))
    assert h.body_offset == 18


# --- truncation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, tags",
    [(1, None), (12, b"\x00"), (12, b"\x02\x00\x02ab\x81\x01\x01z")],
    ids=["v1", "v12-no-tags", "v12-tags"],
)
def test_truncated_header_at_every_length(version: int, tags: bytes | None) -> None:
    payload = raw_header(3, version, 5, b"client", tags)
    whole = framed(payload)
    h = parse_request_header(whole)
    assert h.body_offset == len(whole)  # the header is the whole frame here
    for n in range(len(whole)):
        with pytest.raises(TruncatedMessage):
            parse_request_header(whole[:n])


def test_truncated_null_client_id_header() -> None:
    whole = framed(raw_header(3, 12, 5, None, b"\x00"))
    assert parse_request_header(whole).body_offset == 15
    for n in range(15):
        with pytest.raises(TruncatedMessage):
            parse_request_header(whole[:n])


def test_tagged_field_running_past_the_frame() -> None:
    payload = raw_header(3, 12, 5, b"c", b"\x01\x00\x05abc")  # says 5 bytes, has 3
    with pytest.raises(TruncatedMessage):
        parse_request_header(framed(payload))


def test_overlong_varint_in_header_tags() -> None:
    payload = raw_header(3, 12, 5, b"c", b"\x80\x80\x80\x80\x80\x01")
    with pytest.raises(MalformedMessage):
        parse_request_header(framed(payload))


# --- API key and version checks ---------------------------------------------------------------------


@pytest.mark.parametrize("api_key", [-1, 4, 5, 6, 7, 52, 95, 1000, 32767])
def test_unknown_api_key(api_key: int) -> None:
    with pytest.raises(UnknownApiKey) as exc:
        parse_request_header(framed(raw_header(api_key, 0, 1, b"c")))
    assert exc.value.kind == "unknown_api_key"
    assert isinstance(exc.value, ProtocolError)


@pytest.mark.parametrize("version", [14, 100, -1, -32768])
def test_version_outside_codec_range(version: int) -> None:
    assert codec()[METADATA].max_version == 13
    with pytest.raises(UnsupportedApiVersion) as exc:
        parse_request_header(framed(raw_header(METADATA, version, 1, b"c", b"\x00")))
    assert exc.value.kind == "unsupported_api_version"


def test_api_versions_above_codec_max_returns_header_without_spec() -> None:
    top = codec()[API_VERSIONS].max_version
    # A newer header version's layout is unknown: the bytes after client_id are not read.
    payload = raw_header(API_VERSIONS, top + 1, 77, b"newer-client", b"\xff\xff") + b"??"
    h = parse_request_header(framed(payload))
    assert h.spec is None
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (18, top + 1, 77, "newer-client")
    assert h.body_offset == 14 + len(b"newer-client")


def test_api_versions_far_above_codec_max_with_null_client_id() -> None:
    h = parse_request_header(framed(raw_header(API_VERSIONS, 32767, 1, None)))
    assert h.spec is None
    assert h.client_id is None
    assert h.body_offset == 14


def test_api_versions_with_negative_version_is_still_rejected() -> None:
    with pytest.raises(UnsupportedApiVersion):
        parse_request_header(framed(raw_header(API_VERSIONS, -1, 1, b"c")))


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_within_codec_range(version: int) -> None:
    req = ApiVersionsRequest(version=version, client_software_name="kqp-test",
                             client_software_version="1.0")
    body = bytes(req.encode(version=version))
    req.with_header(correlation_id=3, client_id="cli")
    frame = bytes(req.encode(version=version, header=True, framed=True))
    h = parse_request_header(memoryview(frame))
    assert h.spec is codec()[API_VERSIONS]
    assert h.body_offset == 17 + (1 if version >= 3 else 0)
    assert frame[h.body_offset :] == body


def _version_samples() -> list[tuple[int, int]]:
    out = set()
    for key, spec in codec().items():
        out.add((key, 0))
        out.add((key, spec.max_version))
        if spec.flexible_from is not None:
            out.add((key, spec.flexible_from))
            if spec.flexible_from > 0:
                out.add((key, spec.flexible_from - 1))
    return sorted(out)


def test_a_refused_api_key_is_unknown_to_the_proxy_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # REFUSED is empty today (KIP-932's APIs left it); the mechanism stays for the next one.
    api_key = 78
    monkeypatch.setitem(REFUSED, api_key, "a reason")
    with pytest.raises(UnknownApiKey) as exc:
        parse_request_header(framed(raw_header(api_key, 1, 1, b"c", b"\x00")))
    assert str(exc.value) == f"{codec()[api_key].name} is refused by the proxy (a reason)"
    monkeypatch.delitem(REFUSED, api_key)
    assert parse_request_header(framed(raw_header(api_key, 1, 1, b"c", b"\x00"))).api_key == api_key


@pytest.mark.parametrize("api_key, version", [(k, v) for k, v in _version_samples() if k not in REFUSED])
def test_header_layout_matches_kafka_python_for_every_api(api_key: int, version: int) -> None:
    spec = codec()[api_key]
    flexible = spec.request.flexible_version_q(version)
    assert spec.is_flexible(version) == flexible
    assert spec.request_header_version(version) == (2 if flexible else 1)
    header = KafkaRequestHeader(request_api_key=api_key, request_api_version=version,
                                correlation_id=123456, client_id="some-client")
    header_bytes = bytes(header.encode(flexible=flexible))
    frame = framed(header_bytes + b"BODY")
    h = parse_request_header(frame)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (api_key, version, 123456,
                                                                          "some-client")
    assert h.spec is spec
    assert h.body_offset == 4 + len(header_bytes)
    assert bytes(frame[h.body_offset :]) == b"BODY"


# --- responses ---------------------------------------------------------------------------------------


def test_response_header_versions() -> None:
    md = codec()[METADATA]
    assert md.response_header_version(8) == 0
    assert md.response_header_version(9) == 1
    av = codec()[API_VERSIONS]
    for v in range(av.max_version + 1):
        assert av.response_header_version(v) == 0  # always v0 (KIP-511)


def test_response_correlation_id() -> None:
    assert response_correlation_id(b"\x00\x00\x00\x04\x00\x00\x01\x02") == 258
    assert response_correlation_id(memoryview(b"\x00\x00\x00\x05\xff\xff\xff\xfe\x00")) == -2
    for n in range(8):
        with pytest.raises(TruncatedMessage):
            response_correlation_id(b"\x00\x00\x00\x04\x00\x00\x01\x02"[:n])


def test_response_body_offset_v0() -> None:
    frame = b"\x00\x00\x00\x07\x00\x00\x00\x01abc"
    assert response_body_offset(frame, 0) == 8
    assert response_body_offset(memoryview(frame), 0) == 8


def test_response_body_offset_v1_empty_tags() -> None:
    frame = b"\x00\x00\x00\x08\x00\x00\x00\x01\x00abc"
    assert response_body_offset(frame, 1) == 9


def test_response_body_offset_v1_with_tags() -> None:
    tags = b"\x02\x00\x01x\x03\x02yz"
    frame = i32(4 + len(tags) + 3) + i32(1) + tags + b"abc"
    assert response_body_offset(frame, 1) == 8 + len(tags)
    assert frame[response_body_offset(frame, 1) :] == b"abc"


def test_response_body_offset_v1_truncated_tags() -> None:
    with pytest.raises(TruncatedMessage):
        response_body_offset(i32(5) + i32(1), 1)
    with pytest.raises(TruncatedMessage):
        response_body_offset(i32(8) + i32(1) + b"\x01\x00\x05", 1)


def test_frame_response_exact_bytes() -> None:
    assert frame_response(7, 0, b"body") == b"\x00\x00\x00\x08\x00\x00\x00\x07body"
    assert frame_response(7, 1, b"body") == b"\x00\x00\x00\x09\x00\x00\x00\x07\x00body"
    assert frame_response(-1, 0, b"") == b"\x00\x00\x00\x04\xff\xff\xff\xff"


@pytest.mark.parametrize("version", [0, 8, 9, 12])
def test_frame_response_round_trips_through_kafka_python(version: int) -> None:
    msg = MetadataResponse(version=version, throttle_time_ms=0, brokers=[
        MetadataResponse.MetadataResponseBroker(node_id=1, host="h", port=9092, rack=None)],
        cluster_id="c", controller_id=1, topics=[])
    body = bytes(msg.encode(version=version))
    header_version = codec()[METADATA].response_header_version(version)
    frame = frame_response(99, header_version, body)
    assert response_correlation_id(frame) == 99
    assert frame[response_body_offset(frame, header_version) :] == body
    decoded = MetadataResponse.decode(frame, version=version, header=True, framed=True)
    assert decoded.header.correlation_id == 99
    assert decoded.brokers[0].host == "h"
