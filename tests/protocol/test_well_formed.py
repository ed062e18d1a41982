"""The request body check (protocol/well_formed.py) on named inputs: the whole-proxy fuzz's, each
rule Kafka's parser has, and what real clients send that a stricter check would refuse."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.admin.topics import CreateTopicsRequest

from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import MalformedMessage, ProtocolError, TruncatedMessage
from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from kafka_quota_proxy.protocol.well_formed import check_request, compile_check
from tests.support.encoding import uvarint
from tests.support.frames import FUZZ_CREATE_TOPICS, LIBRDKAFKA_METADATA


def request_frame(key: int, version: int, corr: int, body: bytes, flexible: bool = False) -> bytes:
    header = struct.pack(">hhih", key, version, corr, 1) + b"c" + (b"\x00" if flexible else b"")
    return struct.pack(">i", len(header) + len(body)) + header + body


def check(frame: bytes) -> None:
    view = memoryview(frame)
    check_request(view, parse_request_header(view))


def test_the_fuzz_request_that_killed_tansu_is_refused_for_its_null_arrays() -> None:
    with pytest.raises(MalformedMessage, match=r"^CreateTopics v7: Topics\[\]\.Assignments: null in a field "
                                               r"that is not nullable$"):
        check(FUZZ_CREATE_TOPICS)


def test_its_well_formed_twin_passes() -> None:
    # Every length true: not this check's to refuse (CreateTopicsLimit refuses it).
    topic = CreateTopicsRequest.CreatableTopic(name="big", num_partitions=825360385, replication_factor=1,
                                               assignments=[], configs=[])
    check(frame_request(CreateTopicsRequest(topics=[topic], timeout_ms=1000, validate_only=False), 7, 1, "c"))


def test_bytes_after_the_body_are_left_alone_as_kafka_leaves_them() -> None:
    check(LIBRDKAFKA_METADATA)


@pytest.mark.parametrize(("body", "error", "message"), [
    # Kafka: "Tried to allocate a collection of size 2147483647, but there are only 0 bytes remaining."
    (struct.pack(">hhii", -1, 0, 1000, 0x7FFFFFFF), TruncatedMessage,
     "Produce v3: TopicData: an array of 2147483647, 0 bytes left"),
    (struct.pack(">hhii", -1, 0, 1000, -2), MalformedMessage, "Produce v3: TopicData: length -2"),
    (struct.pack(">hhii", -1, 0, 1000, -1), MalformedMessage,
     "Produce v3: TopicData: null in a field that is not nullable"),
    (struct.pack(">h", 10) + b"ab", TruncatedMessage, "Produce v3: TransactionalId: runs past the end"),
    (struct.pack(">hhi", -1, 0, 1000), TruncatedMessage, "Produce v3: TopicData: runs past the end"),
    # a partition's records longer than what is left
    (struct.pack(">hhiih", -1, 0, 1000, 1, 1) + b"t" + struct.pack(">iii", 1, 0, 100) + b"x" * 99,
     TruncatedMessage, "Produce v3: TopicData[].PartitionData[].Records: runs past the end (99 bytes were "
                       "left)"),
], ids=["count-beyond-bytes", "negative-count", "null-not-nullable", "string-past-end", "fixed-past-end",
        "records-past-end"])
def test_each_length_rule(body: bytes, error: type[ProtocolError], message: str) -> None:
    with pytest.raises(error) as raised:
        check(request_frame(0, 3, 1, body))
    assert str(raised.value).startswith(message)


def test_null_is_fine_where_the_schema_allows_it() -> None:
    # Produce v3: transactional_id null, no topics; a partition with null records
    check(request_frame(0, 3, 1, struct.pack(">hhii", -1, 0, 1000, 0)))
    one_partition = struct.pack(">hhiih", -1, 0, 1000, 1, 1) + b"t"
    check(request_frame(0, 3, 1, one_partition + struct.pack(">iii", 1, 0, -1)))


def test_a_compact_string_over_32767_bytes_is_refused() -> None:
    # Metadata v12, one topic (topic_id, then the name as a compact string of 32,768 bytes)
    name = b"t" * 32768
    body = uvarint(2) + bytes(16) + uvarint(len(name) + 1) + name + b"\x00" + b"\x00\x00\x00"
    with pytest.raises(MalformedMessage, match="Topics\\[\\].Name: length 32768"):
        check(request_frame(3, 12, 1, body, flexible=True))


def test_a_known_tagged_field_must_fit_in_its_size() -> None:
    # Fetch v12 ends in tagged fields; tag 0 is ClusterId, a compact nullable string. Here it
    # claims 5 bytes of text inside a tag of 2.
    head = struct.pack(">iiiibii", -1, 500, 1, 1 << 20, 0, 0, -1) + uvarint(1) + uvarint(1) + uvarint(1)
    with pytest.raises(TruncatedMessage, match="ClusterId"):
        check(request_frame(1, 12, 1, head + uvarint(1) + uvarint(0) + uvarint(2) + uvarint(6) + b"x",
                            flexible=True))
    # An unknown tag is skipped by its size, whatever it holds.
    check(request_frame(1, 12, 1, head + uvarint(1) + uvarint(9) + uvarint(2) + b"\xff\xff", flexible=True))


def test_every_api_and_version_of_the_codec_compiles() -> None:
    for spec in codec().values():
        for version in range(spec.max_version + 1):
            compile_check(spec.request.name, version, spec.is_flexible(version))
