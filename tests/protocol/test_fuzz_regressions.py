"""Inputs the coverage-guided fuzzer (make fuzz, tests/fuzz) crashed a decoder with, exactly as it
found them: each must now end in the protocol's own error, never another exception."""

from __future__ import annotations

import base64

import pytest

from kafka_quota_proxy.protocol.errors import TruncatedMessage
from kafka_quota_proxy.protocol.fetch import read_fetch_request, session_id
from kafka_quota_proxy.protocol.headers import parse_request_header, response_body_offset
from kafka_quota_proxy.protocol.throttle import throttle_offset


def test_fetch_v16_with_an_empty_replica_state_tag() -> None:
    # crash-f0e8a213324e61cca5c8095b05067e2241ad1486 (fetch target): a Fetch v16 whose
    # ReplicaState tag (1) is 0 bytes long, last in the body. The replica id was read from the
    # tag's offset whatever its size: struct.error past the end of the body.
    frame = memoryview(base64.b64decode(
        "AAAAXgABABAAAAAGAAdyZGthZmthAAAAAfQAAAABAyAAAAEAAAAA/////wIBogpZVCp4UYz+C54fYtZTAgAAAAEA"
        "BgAPYWlva2Fma2EtMC4xNC4w/////wAAAfQAAAABAyAAAQEA"))
    header = parse_request_header(frame)
    assert (header.api_key, header.api_version) == (1, 16)
    with pytest.raises(TruncatedMessage, match="needs 4 bytes at offset 80, message has 80"):
        read_fetch_request(frame, header.body_offset, header.api_version)


def test_fetch_response_body_too_short_for_its_session_id() -> None:
    # crash-0bec6e8c5eef54b71c92f03cf3589312c788d512 (throttle target): api key 1, version 9,
    # then a response frame whose body is 5 bytes: throttle_time_ms is there, session_id (at
    # offset 6) is not. quota_settle reads it when it empties an over-quota Fetch: struct.error.
    found = bytes.fromhex("0001000900000000000000000000000000")
    api_key, version, frame = int.from_bytes(found[:2]), int.from_bytes(found[2:4]), memoryview(found[4:])
    body = frame[response_body_offset(frame, 0):]
    assert (api_key, version, len(body)) == (1, 9, 5)
    assert throttle_offset(api_key, version, body) == 0
    with pytest.raises(TruncatedMessage):
        session_id(body, version)
    assert session_id(memoryview(bytes(10)), version) == 0
    assert session_id(body, 6) == 0  # before v7 there is no session id to read
