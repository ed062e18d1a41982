"""The ApiVersions stages (proxy/stages/api_versions.py), called directly. ApiVersionsGate answers
a request newer than the codec knows with the v0 UNSUPPORTED_VERSION body (KIP-511) and passes
any other on. ApiVersionsIntersect leaves in the broker's answer only what the codec can read:
unknown keys and ranges the codec cannot reach are dropped, a maximum is capped at the codec's,
the APIs the proxy serves itself are added where the broker lacks them, every other field
(tagged ones included) passes as it came, and an error answer other than UNSUPPORTED_VERSION is
forwarded as is."""

from __future__ import annotations

import struct
from typing import Any

from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse

from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.stages.api_versions import ApiVersionsGate, ApiVersionsIntersect
from kafka_quota_proxy.proxy.stages.base import Reply
from tests.proxy.conftest import request_frame

API_VERSIONS, PRODUCE, FETCH, DESCRIBE_CLIENT_QUOTAS = 18, 0, 1, 48
UNSUPPORTED_VERSION, INVALID_REQUEST = 35, 42
NEWEST = codec()[API_VERSIONS].max_version
UNKNOWN_KEY = 9999


def context(version: int) -> RequestContext:
    if version <= NEWEST:
        request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
        frame = memoryview(frame_request(request, version, 7, "c"))
    else:  # a body the proxy cannot read: only the header is looked at
        frame = memoryview(request_frame(API_VERSIONS, version, 7, b"\x02t\x021\x00", flexible=True))
    return RequestContext(parse_request_header(frame), frame, ConnectionInfo("127.0.0.1:5000", "bootstrap"))


def broker_answer(version: int, keys: list[tuple[int, int, int]], error_code: int = 0, **kw: Any) -> bytes:
    cls: Any = ApiVersionsResponse
    entries = [cls.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in keys]
    return bytes(cls(version=version, error_code=error_code, throttle_time_ms=0, api_keys=entries,
                     **kw).encode(version=version))


def decoded(body: bytes, version: int) -> Any:
    return ApiVersionsResponse.decode(body, version=version)


def keys_of(msg: Any) -> list[tuple[int, int, int]]:
    return [(k.api_key, k.min_version, k.max_version) for k in msg.api_keys]


def test_a_version_newer_than_the_codec_gets_unsupported_version_in_v0() -> None:
    ctx = context(NEWEST + 1)
    assert ctx.header.spec is None
    reply = ApiVersionsGate().on_request(ctx)
    # v0: error_code, then api_keys [ApiVersions 0..NEWEST], nothing else
    expected = struct.pack(">hihhh", UNSUPPORTED_VERSION, 1, API_VERSIONS, 0, NEWEST)
    assert reply == Reply(expected)


def test_a_version_the_codec_knows_goes_on() -> None:
    gate = ApiVersionsGate()
    assert gate.api_keys == frozenset({API_VERSIONS})
    assert gate.on_request(context(NEWEST)) is None
    assert gate.on_request(context(0)) is None


def test_the_answer_keeps_only_what_the_codec_reads_and_adds_what_the_proxy_serves() -> None:
    produce_max = codec()[PRODUCE].max_version
    broker = [(PRODUCE, 3, produce_max + 5), (FETCH, produce_max + 50, produce_max + 60),
              (API_VERSIONS, 0, 3), (UNKNOWN_KEY, 0, 1)]
    body = broker_answer(3, broker, finalized_features_epoch=12)
    stage = ApiVersionsIntersect(served=((DESCRIBE_CLIENT_QUOTAS, 0, 1), (API_VERSIONS, 0, 9)))
    new = stage.on_response(context(3), memoryview(body))
    assert new is not None
    msg = decoded(new, 3)
    assert keys_of(msg) == [
        (PRODUCE, 3, produce_max),  # capped at the codec's
        # Fetch: no version both can read; the unknown key: gone
        (API_VERSIONS, 0, 3),  # the broker's, not the proxy's own entry for a key the broker has
        (DESCRIBE_CLIENT_QUOTAS, 0, 1),  # served by the proxy, in key order
    ]
    assert (msg.error_code, msg.throttle_time_ms, msg.finalized_features_epoch) == (0, 0, 12)


def test_an_answer_already_within_the_codec_is_the_same_bytes() -> None:
    body = broker_answer(3, [(PRODUCE, 0, 9), (API_VERSIONS, 0, 3)], finalized_features_epoch=3)
    assert ApiVersionsIntersect().on_response(context(3), memoryview(body)) == body


def test_the_brokers_unsupported_version_answer_is_read_in_v0() -> None:
    body = broker_answer(0, [(API_VERSIONS, 0, 3), (UNKNOWN_KEY, 0, 1)], error_code=UNSUPPORTED_VERSION)
    new = ApiVersionsIntersect().on_response(context(3), memoryview(body))
    assert new == broker_answer(0, [(API_VERSIONS, 0, 3)], error_code=UNSUPPORTED_VERSION)


def test_another_error_is_forwarded_as_it_came() -> None:
    body = broker_answer(3, [], error_code=INVALID_REQUEST)
    assert ApiVersionsIntersect().on_response(context(3), memoryview(body)) == body
