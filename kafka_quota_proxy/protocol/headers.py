"""Request and response headers of every version, read from fixed positions.

Request header v1: api_key int16, api_version int16, correlation_id int32, client_id nullable
int16-length string. v2 (flexible versions) adds a tagged-field section. The client_id is never
a compact string, even in v2. Response header v0: correlation_id int32; v1 adds tagged fields.
All offsets below are into a whole frame, i.e. after the 4-byte size prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafka_quota_proxy.protocol.api_keys import API_VERSIONS
from kafka_quota_proxy.protocol.apis import ApiSpec, spec_for
from kafka_quota_proxy.protocol.errors import MalformedMessage, TruncatedMessage, UnsupportedApiVersion
from kafka_quota_proxy.protocol.primitives import INT16, INT32, encode_uvarint, need, skip_tagged_fields

# Offsets inside a frame (size prefix at 0..4).
API_KEY_AT = 4
API_VERSION_AT = 6
CORRELATION_ID_AT = 8
CLIENT_ID_AT = 12
PROXY_CLIENT_ID = "kafka-quota-proxy"  # the client-id of the proxy's own requests to brokers
RESPONSE_CORRELATION_ID_AT = 4


@dataclass(slots=True)
class RequestHeader:
    """What the proxy knows about a request after reading its header."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # offset of the request body inside the frame
    spec: ApiSpec | None  # None only for an ApiVersions request newer than the codec


def parse_request_header(frame: memoryview) -> RequestHeader:
    """Parse the header of a request frame; raise a ProtocolError if it is not one we can forward."""
    need(frame, 0, CLIENT_ID_AT + 2)
    (api_key,) = INT16.unpack_from(frame, API_KEY_AT)
    (api_version,) = INT16.unpack_from(frame, API_VERSION_AT)
    (correlation_id,) = INT32.unpack_from(frame, CORRELATION_ID_AT)
    (n,) = INT16.unpack_from(frame, CLIENT_ID_AT)
    pos = CLIENT_ID_AT + 2
    client_id: str | None
    if n < 0:
        if n != -1:
            raise MalformedMessage(f"client_id length {n}")
        client_id = None
    else:
        need(frame, pos, n)
        try:
            client_id = bytes(frame[pos : pos + n]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedMessage("client_id is not UTF-8") from exc
        pos += n
    spec: ApiSpec | None
    try:
        spec = spec_for(api_key, api_version)
    except UnsupportedApiVersion:
        # KIP-511: a client may send ApiVersions at a version the server does not know; the
        # server answers with UNSUPPORTED_VERSION in a v0 body rather than dropping it.
        if api_key != API_VERSIONS or api_version < 0:
            raise
        return RequestHeader(api_key, api_version, correlation_id, client_id, pos, None)
    if spec.request_header_version(api_version) >= 2:
        pos = skip_tagged_fields(frame, pos)
    if pos > len(frame):
        raise TruncatedMessage("request header runs past the frame")
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos, spec)


def response_correlation_id(frame: memoryview | bytes) -> int:
    need(frame, 0, RESPONSE_CORRELATION_ID_AT + 4)
    return int(INT32.unpack_from(frame, RESPONSE_CORRELATION_ID_AT)[0])


def response_body_offset(frame: memoryview | bytes, header_version: int) -> int:
    pos = RESPONSE_CORRELATION_ID_AT + 4
    if header_version >= 1:
        pos = skip_tagged_fields(frame, pos)
    return pos


def response_prefix(frame: bytes | memoryview, body_at: int, body_size: int) -> bytes:
    """A response's size prefix for a new body of `body_size`, then the response header of
    `frame` (correlation id, header tags) as it was; `body_at` is where its body started."""
    return INT32.pack(body_at - 4 + body_size) + bytes(frame[4:body_at])


def size_prefixed(payload: bytes) -> bytes:
    """A frame: the payload behind its int32 size (a bare SASL v0 token is framed so too)."""
    return INT32.pack(len(payload)) + payload


def frame_request(request: Any, version: int, correlation_id: int, client_id: str | None) -> bytes:
    """A whole request frame: a kafka-python request message encoded with its request header."""
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(version=version, header=True, framed=True))


def frame_response(correlation_id: int, header_version: int, body: bytes) -> bytes:
    """A whole response frame around an encoded body (header tagged fields left empty)."""
    header = INT32.pack(correlation_id) + (encode_uvarint(0) if header_version >= 1 else b"")
    return size_prefixed(header + body)
