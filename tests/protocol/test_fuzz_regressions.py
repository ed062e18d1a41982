"""Inputs the coverage-guided fuzzer (make fuzz, tests/fuzz) crashed a decoder with, exactly as it
found them: each must now end in the protocol's own error, never another exception."""

from __future__ import annotations

import base64

import pytest

from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import MalformedMessage, TruncatedMessage
from kafka_quota_proxy.protocol.fetch import read_fetch_request, session_id
from kafka_quota_proxy.protocol.headers import parse_request_header, response_body_offset
from kafka_quota_proxy.protocol.messages import decode_response
from kafka_quota_proxy.protocol.throttle import throttle_offset
from kafka_quota_proxy.protocol.well_formed import check_request
from kafka_quota_proxy.proxy.stages.topic_configs import broker_results, described
from kafka_quota_proxy.quota.topic_configs import DescribeAdditions
from tests.support.messages import has_nullable_struct


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


def test_streams_group_heartbeat_with_a_negative_nullable_struct_marker() -> None:
    # crash-32e5f158b5295d0d6d4cc538a556e3acbe5563db (well_formed target): a StreamsGroupHeartbeat
    # v1 request whose UserEndpoint marker is 0xfd (-3). Kafka reads any negative marker as null,
    # and so does the proxy's check, which passes the body; kafka-python reads only -1 as null,
    # takes the struct as there and runs past the end (IndexError). Not the proxy's to crash on:
    # it never decodes this API, and the broker reads it as Kafka does.
    frame = memoryview(base64.b64decode(
        "AAAAlABYAAEAAAQMAARtYWRlAAJnAQAAACoAAAADB29yZGVycwdvcmRlcnP//////wECA8OpAQADCW1lbWJlci0z"
        "AwAAAAMAAAADAAJnAwAAACoAAAABAAH9AgECZwABAxJicm9rZXItMS5pbnRlcm5hbP////8AAAAAAAAAKgAJbWVt"
        "YmVyLTEAAAAAAAAAAAAAACoAAQA="))
    header = parse_request_header(frame)
    assert (header.api_key, header.api_version) == (88, 1)
    check_request(frame, header)  # passes, as Kafka's parser would
    assert has_nullable_struct(codec()[88].request, 1)
    with pytest.raises(IndexError):
        codec()[88].request.decode(bytes(frame[header.body_offset:]), version=1)


@pytest.mark.parametrize("found, message", [
    # (splice target, in make test's replay of mutated seeds) an IncrementalAlterConfigs v1 and
    # a DescribeConfigs v4 answer whose results array is null (compact length 0): kafka-python
    # reads it as None, and TopicConfigsAnswer iterated it (TypeError).
    ("002c00010000002c0000043b000000000c000004", "IncrementalAlterConfigs responses is null"),
    ("002000040c00000b0000043700000900000000ffffffff0000043700000900000000ffffffff00ffffffffffffff"
     "002a7fffffffffffffff0000000000000003000000000000002a030000002a076f726465ffff002affff007fff00"
     "007fff00000000010201087fffffffffffffff020d02076f7264657273002a000000",
     "107 trailing bytes after the message"),  # the walk refuses it first; without them: "is null"
])
def test_null_results_in_a_configs_answer(found: str, message: str) -> None:
    data = bytes.fromhex(found)
    api_key, version, frame = int.from_bytes(data[:2]), int.from_bytes(data[2:4]), memoryview(data[4:])
    body = frame[response_body_offset(frame, 1):]  # both versions are flexible: header v1
    msg = decode_response(api_key, version, body)
    with pytest.raises(MalformedMessage, match=message):
        if api_key == 32:
            described(body, version, msg, DescribeAdditions({}, False, False))
        else:
            broker_results(msg)
