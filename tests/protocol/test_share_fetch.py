"""share_fetch_topics: a ShareFetch response's record bytes per topic, walked by its schema, on
bodies kafka-python writes and on bodies built by hand (an independent encoder): exact sizes, the
checks Kafka's parser makes, and the bytes it leaves alone."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest

from kafka_quota_proxy.protocol.api_keys import SHARE_FETCH
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import MalformedMessage, ProtocolError, TruncatedMessage
from kafka_quota_proxy.protocol.share_fetch import ShareFetchTopic, share_fetch_topics
from tests.support.encoding import compact_string, uvarint

RESPONSE: Any = codec()[SHARE_FETCH].response
TOPIC = RESPONSE.ShareFetchableTopicResponse
PART = TOPIC.PartitionData
VERSIONS = [0, 1, 2]  # v0 was early access (Kafka 4.0), its records nullable; the codec still frames it
A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)


def part(index: int, records: bytes | None, acquired: int = 1, error: int = 0) -> Any:
    return PART(partition_index=index, error_code=error, error_message="e" * index or None,
                acknowledge_error_code=0, acknowledge_error_message=None,
                current_leader=PART.LeaderIdAndEpoch(leader_id=1, leader_epoch=index),
                records=records, acquired_records=[
                    PART.AcquiredRecords(first_offset=i, last_offset=i + 9, delivery_count=1)
                    for i in range(acquired)])


def body(version: int, topics: list[tuple[uuid.UUID, list[Any]]], endpoints: int = 0) -> bytes:
    return bytes(RESPONSE(
        version=version, throttle_time_ms=7, error_code=0, error_message=None,
        acquisition_lock_timeout_ms=30_000, responses=[TOPIC(topic_id=t, partitions=p) for t, p in topics],
        node_endpoints=[RESPONSE.NodeEndpoint(node_id=n, host=f"broker-{n}", port=9092, rack="r")
                        for n in range(endpoints)]).encode(version=version))


@pytest.mark.parametrize("version", VERSIONS)
def test_each_topic_is_charged_its_partitions_record_bytes(version: int) -> None:
    # 200 bytes cross a compact length's one-byte boundary (127); an empty record set counts 0.
    data = body(version, [(A, [part(0, b"a" * 200), part(1, b""), part(2, b"a" * 5, acquired=3)]),
                          (B, [part(7, b"b" * 1000, error=6)]),
                          (A, [])], endpoints=2)
    assert share_fetch_topics(memoryview(data), version) == [
        ShareFetchTopic(A.bytes, 205), ShareFetchTopic(B.bytes, 1000), ShareFetchTopic(A.bytes, 0)]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_response_without_topics(version: int) -> None:
    assert share_fetch_topics(memoryview(body(version, [])), version) == []


def hand_built(version: int, records: bytes, tail: bytes = b"") -> bytes:
    """One topic of one partition, written field by field from ShareFetchResponse.json."""
    partition = (struct.pack(">ih", 3, 0) + compact_string(None) + struct.pack(">h", 0) + compact_string(None)
                 + struct.pack(">ii", -1, -1) + b"\x00"  # CurrentLeader and its tags
                 + records
                 + uvarint(2) + struct.pack(">qqh", 0, 9, 1) + b"\x00"  # one AcquiredRecords
                 + b"\x00")  # the partition's tags
    lock = struct.pack(">i", 30_000) if version >= 1 else b""  # AcquisitionLockTimeoutMs
    head = struct.pack(">ih", 0, 0) + compact_string(None) + lock
    return (head + uvarint(2) + A.bytes + uvarint(2) + partition + b"\x00"  # the topic's tags
            + uvarint(1) + b"\x00" + tail)  # no NodeEndpoints; the top-level tags


@pytest.mark.parametrize("version", VERSIONS)
def test_a_hand_built_body(version: int) -> None:
    assert share_fetch_topics(memoryview(hand_built(version, uvarint(4) + b"abc")), version) == [
        ShareFetchTopic(A.bytes, 3)]


def test_null_records_are_refused_from_v1_as_kafkas_parser_refuses_them() -> None:
    assert share_fetch_topics(memoryview(hand_built(0, b"\x00")), 0) == [ShareFetchTopic(A.bytes, 0)]
    for version in (1, 2):
        with pytest.raises(MalformedMessage, match="records: null"):
            share_fetch_topics(memoryview(hand_built(version, b"\x00")), version)


@pytest.mark.parametrize("version", [1, 2])
def test_bytes_after_the_body_are_left_alone(version: int) -> None:
    data = hand_built(version, uvarint(4) + b"abc", tail=b"\x07\x07")
    assert share_fetch_topics(memoryview(data), version) == [ShareFetchTopic(A.bytes, 3)]


@pytest.mark.parametrize("version", [1, 2])
def test_unknown_tags_in_a_partition_and_a_topic_are_skipped(version: int) -> None:
    data = hand_built(version, uvarint(4) + b"abc")
    at = data.index(struct.pack(">qqh", 0, 9, 1)) + 18 + 1  # after the AcquiredRecords entry
    tags = uvarint(1) + uvarint(9) + uvarint(3) + b"xyz"
    assert data[at:at + 2] == b"\x00\x00"  # the partition's tags, then the topic's
    data = data[:at] + tags + tags + data[at + 2:]
    assert share_fetch_topics(memoryview(data), version) == [ShareFetchTopic(A.bytes, 3)]


@pytest.mark.parametrize("version", [1, 2])
def test_truncated_at_every_length(version: int) -> None:
    data = memoryview(body(version, [(A, [part(0, b"a" * 200), part(1, b"")]), (B, [part(2, b"b")])],
                           endpoints=1))
    for n in range(len(data)):
        with pytest.raises(TruncatedMessage):
            share_fetch_topics(data[:n], version)


@pytest.mark.parametrize("data, message", [
    (struct.pack(">ih", 0, 0) + b"\x00" + struct.pack(">i", 0) + b"\x00", "Responses: null"),
    (struct.pack(">ih", 0, 0) + b"\x00" + struct.pack(">i", 0) + uvarint(2) + A.bytes + b"\x00",
     "Partitions: null"),
    (struct.pack(">ih", 0, 0) + b"\x00" + struct.pack(">i", 0) + uvarint(1000) + b"\x00" * 20,
     "Responses: an array of 999, 20 bytes left"),
])
def test_malformed_bodies(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        share_fetch_topics(memoryview(data), 1)
