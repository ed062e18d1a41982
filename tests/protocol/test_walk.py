"""The schema-driven Walker over Produce and Fetch responses built by kafka-python."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.metadata.metadata import MetadataResponse as M
from kafka.protocol.producer.produce import ProduceResponse

from kafka_quota_proxy.protocol.errors import MalformedMessage, ProtocolError, TruncatedMessage
from kafka_quota_proxy.protocol.walk import Walker, tagged_fields, walker
from tests.support.encoding import compact_string, uvarint

PTopic = ProduceResponse.TopicProduceResponse
PPart = PTopic.PartitionProduceResponse
FTopic = FetchResponse.FetchableTopicResponse
FPart = FTopic.PartitionData

THROTTLE = 0x01020304


# --- an independent encoder for the parts the tests check ---------------------------------------------


def node_endpoints_section(endpoints: list[tuple[int, str, int, str | None]]) -> bytes:
    """A top-level tagged-field section holding only node_endpoints (tag 0)."""
    value = uvarint(len(endpoints) + 1) + b"".join(
        struct.pack(">i", node) + compact_string(host) + struct.pack(">i", port) + compact_string(rack)
        + b"\x00"
        for node, host, port, rack in endpoints
    )
    return b"\x01" + b"\x00" + uvarint(len(value)) + value


ENDPOINTS = [(1, "broker-1.internal", 9092, "rack-a"), (3, "b3", 19092, None)]


# --- message builders --------------------------------------------------------------------------------


def produce_response(version: int, *, message_len: int = 5, current_leader: bool = False,
                     node_endpoints: bool = False, responses: bool = True) -> ProduceResponse:
    def part(index: int, error: int) -> PPart:
        kw: dict[str, Any] = dict(index=index, error_code=error, base_offset=1000 + index,
                                  log_append_time_ms=-1, log_start_offset=17)
        if version >= 8:
            kw["record_errors"] = [PPart.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                                   for i, m in enumerate(["bad", None, "x" * message_len])]
            kw["error_message"] = "e" * message_len if error else None
        if current_leader and version >= 10 and error:
            kw["current_leader"] = PPart.LeaderIdAndEpoch(leader_id=3, leader_epoch=9)
        return PPart(**kw)

    def topic(name: str, n: int) -> PTopic:
        ident = {"topic_id": uuid.uuid5(uuid.NAMESPACE_DNS, name)} if version >= 13 else {"name": name}
        return PTopic(**ident, partition_responses=[part(i, 6 if i == 1 else 0) for i in range(n)])

    kw: dict[str, Any] = {}
    if node_endpoints and version >= 10:
        kw["node_endpoints"] = [ProduceResponse.NodeEndpoint(node_id=n, host=h, port=p, rack=r)
                                for n, h, p, r in ENDPOINTS]
    return ProduceResponse(version=version, throttle_time_ms=THROTTLE,
                           responses=[topic("orders", 3), topic("t" * 200, 1)] if responses else [], **kw)


def records(seed: int, size: int) -> bytes:
    return bytes((seed + i) % 251 for i in range(size))


def fetch_response(version: int, record_sizes: list[int | None], *, partition_tags: bool = False,
                   node_endpoints: bool = False, responses: bool = True) -> FetchResponse:
    def part(index: int, size: int | None) -> FPart:
        kw: dict[str, Any] = dict(partition_index=index, error_code=0, high_watermark=500 + index,
                                  last_stable_offset=400, log_start_offset=3,
                                  aborted_transactions=None if index % 2 else
                                  [FPart.AbortedTransaction(producer_id=7, first_offset=8)],
                                  preferred_read_replica=-1,
                                  records=None if size is None else records(index, size))
        if partition_tags and version >= 12:
            kw["current_leader"] = FPart.LeaderIdAndEpoch(leader_id=2, leader_epoch=4)
            kw["diverging_epoch"] = FPart.EpochEndOffset(epoch=1, end_offset=99)
            kw["snapshot_id"] = FPart.SnapshotId(end_offset=5, epoch=6)
        return FPart(**kw)

    def topic(name: str) -> FTopic:
        ident = {"topic_id": uuid.uuid5(uuid.NAMESPACE_DNS, name)} if version >= 13 else {"topic": name}
        return FTopic(**ident, partitions=[part(i, s) for i, s in enumerate(record_sizes)])

    kw: dict[str, Any] = {}
    if node_endpoints and version >= 16:
        kw["node_endpoints"] = [FetchResponse.NodeEndpoint(node_id=n, host=h, port=p, rack=r)
                                for n, h, p, r in ENDPOINTS]
    return FetchResponse(version=version, throttle_time_ms=THROTTLE, error_code=0, session_id=1234,
                         responses=[topic("events"), topic("logs")] if responses else [], **kw)


def encode(msg: Any, version: int) -> bytes:
    return bytes(msg.encode(version=version))


# --- Produce -------------------------------------------------------------------------------------------

PRODUCE_CASES = [
    (v, cl, ne, ml)
    for v in range(1, 14)
    for cl, ne in ((False, False), (True, False), (False, True), (True, True))
    for ml in (0, 5, 127, 300)
    if v >= 10 or not (cl or ne)
]


@pytest.mark.parametrize("version, current_leader, node_endpoints, message_len", PRODUCE_CASES)
def test_produce_response_offsets(version: int, current_leader: bool, node_endpoints: bool,
                                  message_len: int) -> None:
    flexible = version >= 9
    kw = dict(message_len=message_len, current_leader=current_leader, node_endpoints=node_endpoints)
    body = encode(produce_response(version, **kw), version)
    # Independently: with no topics the body is an empty array followed by the same tail.
    empty = encode(produce_response(version, responses=False, **kw), version)
    empty_array = 1 if flexible else 4
    tail = len(empty) - empty_array
    throttle_at = len(body) - tail

    result = Walker("ProduceResponse", version, flexible).walk(memoryview(body), 0)
    assert result.offsets == {"Responses": 0, "ThrottleTimeMs": throttle_at}
    assert body[throttle_at : throttle_at + 4] == struct.pack(">i", THROTTLE)
    assert result.end == len(body)
    if flexible:
        assert result.tags_at == throttle_at + 4
        expected_tags = node_endpoints_section(ENDPOINTS) if node_endpoints else b"\x00"
        assert body[result.tags_at :] == expected_tags
        found = tagged_fields(memoryview(body), result.tags_at)
        if node_endpoints:
            # count 1, tag 0, a one-byte size, then the value
            assert found == {0: (result.tags_at + 3, len(body))}
            assert body[result.tags_at + 3 :] == expected_tags[3:]
        else:
            assert found == {}
    else:
        assert result.tags_at == len(body) == throttle_at + 4


def test_produce_v0_has_no_throttle_time() -> None:
    body = encode(produce_response(0), 0)
    result = Walker("ProduceResponse", 0, False).walk(memoryview(body), 0)
    assert result.offsets == {"Responses": 0}
    assert result.tags_at == result.end == len(body)


@pytest.mark.parametrize("version", [8, 9, 10, 12, 13])
def test_produce_response_truncated_at_every_length(version: int) -> None:
    body = encode(produce_response(version, current_leader=True, node_endpoints=True), version)
    w = walker("ProduceResponse", version, version >= 9)
    w.walk(memoryview(body), 0)
    for n in range(len(body)):
        with pytest.raises(TruncatedMessage):
            w.walk(memoryview(body)[:n], 0)


@pytest.mark.parametrize("version", [8, 9, 10, 13])
def test_produce_response_trailing_bytes(version: int) -> None:
    body = encode(produce_response(version, node_endpoints=True), version)
    w = walker("ProduceResponse", version, version >= 9)
    for extra in (b"\x00", b"\x00\x00\x00\x00", b"junk"):
        with pytest.raises(MalformedMessage) as exc:
            w.walk(memoryview(body + extra), 0)
        assert str(len(extra)) in str(exc.value)


# --- Fetch ---------------------------------------------------------------------------------------------

RECORD_SHAPES = [
    [],
    [0],
    [None],
    [1, None, 126],
    [127, 128],  # a compact length of 128 then 129: one- then two-byte varint
    [300, 16382, 16383],  # compact lengths 16383 (two bytes) and 16384 (three bytes)
]


def fetch_header_len(version: int) -> int:
    return (4 if version >= 1 else 0) + (6 if version >= 7 else 0)


FETCH_CASES = [
    (v, shape_i, pt, ne)
    for v in range(1, 19)
    for shape_i in range(len(RECORD_SHAPES))
    for pt, ne in ((False, False), (True, False), (False, True), (True, True))
    if (v >= 12 or not pt) and (v >= 16 or not ne)
]


@pytest.mark.parametrize("version, shape, partition_tags, node_endpoints", FETCH_CASES)
def test_fetch_response_offsets(version: int, shape: int, partition_tags: bool, node_endpoints: bool) -> None:
    flexible = version >= 12
    sizes = RECORD_SHAPES[shape]
    kw = dict(partition_tags=partition_tags, node_endpoints=node_endpoints)
    body = encode(fetch_response(version, sizes, **kw), version)
    empty = encode(fetch_response(version, sizes, responses=False, **kw), version)
    head = fetch_header_len(version)
    tags_len = len(empty) - head - (1 if flexible else 4)

    result = Walker("FetchResponse", version, flexible).walk(memoryview(body), 0)
    expected = {"ThrottleTimeMs": 0, "Responses": head}
    if version >= 7:
        expected |= {"ErrorCode": 4, "SessionId": 6}
    assert result.offsets == expected
    assert body[0:4] == struct.pack(">i", THROTTLE)
    if version >= 7:
        assert body[4:10] == b"\x00\x00" + struct.pack(">i", 1234)
    assert result.end == len(body)
    assert result.tags_at == len(body) - tags_len
    if flexible:
        expected_tags = node_endpoints_section(ENDPOINTS) if node_endpoints else b"\x00"
        assert body[result.tags_at :] == expected_tags
        found = tagged_fields(memoryview(body), result.tags_at)
        assert list(found) == ([0] if node_endpoints else [])
        if node_endpoints:
            start, end = found[0]
            assert end == len(body)
            assert body[start:end] == expected_tags[3:]
    else:
        assert tags_len == 0


def test_fetch_with_large_records_and_sampled_truncation() -> None:
    version = 16
    sizes = [70_000, None, 5]
    body = encode(fetch_response(version, sizes, partition_tags=True, node_endpoints=True), version)
    w = walker("FetchResponse", version, True)
    result = w.walk(memoryview(body), 0)
    assert result.offsets["Responses"] == 10
    assert body[result.tags_at :] == node_endpoints_section(ENDPOINTS)
    cuts = set(range(0, 200)) | set(range(len(body) - 200, len(body))) | set(range(0, len(body), 997))
    for n in sorted(cuts):
        with pytest.raises(TruncatedMessage):
            w.walk(memoryview(body)[:n], 0)


@pytest.mark.parametrize("version", [11, 12, 13, 16, 18])
def test_fetch_response_truncated_at_every_length(version: int) -> None:
    body = encode(fetch_response(version, [3, None, 130], partition_tags=True, node_endpoints=True), version)
    w = walker("FetchResponse", version, version >= 12)
    w.walk(memoryview(body), 0)
    for n in range(len(body)):
        with pytest.raises(TruncatedMessage):
            w.walk(memoryview(body)[:n], 0)


@pytest.mark.parametrize("version", [11, 12, 16, 18])
def test_fetch_response_trailing_bytes(version: int) -> None:
    body = encode(fetch_response(version, [3]), version)
    with pytest.raises(MalformedMessage):
        walker("FetchResponse", version, version >= 12).walk(memoryview(body + b"\x00"), 0)


def test_walk_from_an_offset_inside_a_larger_buffer() -> None:
    version = 17
    body = encode(fetch_response(version, [10], node_endpoints=True), version)
    prefix = b"\x00\x00\x00\x00\x00\x00\x00\x2a\x00"  # e.g. a frame's size, correlation id, tags
    result = walker("FetchResponse", version, True).walk(memoryview(prefix + body), len(prefix))
    alone = walker("FetchResponse", version, True).walk(memoryview(body), 0)
    assert result.offsets == {k: v + len(prefix) for k, v in alone.offsets.items()}
    assert result.tags_at == alone.tags_at + len(prefix)
    assert result.end == len(prefix) + len(body)


def test_unknown_top_level_tags_are_skipped_and_reported() -> None:
    version = 12
    body = encode(fetch_response(version, [4]), version)
    assert body[-1] == 0
    tags = b"\x02" + b"\x07\x02\xab\xcd" + b"\x81\x01\x00"  # tag 7 (2 bytes), tag 129 (empty)
    patched = body[:-1] + tags
    result = walker("FetchResponse", version, True).walk(memoryview(patched), 0)
    assert result.tags_at == len(body) - 1
    at = result.tags_at
    assert tagged_fields(memoryview(patched), at) == {7: (at + 3, at + 5), 129: (at + 8, at + 8)}


def test_unknown_tags_inside_a_partition_are_skipped() -> None:
    version = 12
    body = encode(fetch_response(version, [None]), version)
    # The single partition ends with records (compact null, 0x00) then its empty tag section 0x00.
    part_tags_at = body.index(b"\xff\xff\xff\xff\x00\x00\x00", 0) + 5
    assert body[part_tags_at] == 0
    patched = body[:part_tags_at] + b"\x01\x09\x03xyz" + body[part_tags_at + 1 :]
    result = walker("FetchResponse", version, True).walk(memoryview(patched), 0)
    assert result.end == len(patched)
    assert result.tags_at == len(patched) - 1


def test_tagged_field_size_past_the_end() -> None:
    version = 12
    body = encode(fetch_response(version, []), version)
    patched = body[:-1] + b"\x01\x00\x10abc"
    with pytest.raises(TruncatedMessage):
        walker("FetchResponse", version, True).walk(memoryview(patched), 0)
    with pytest.raises(TruncatedMessage):
        tagged_fields(memoryview(patched), len(body) - 1)


def test_negative_lengths_are_malformed() -> None:
    # Produce v8: responses int32 array length -2.
    with pytest.raises(MalformedMessage):
        walker("ProduceResponse", 8, False).walk(memoryview(b"\xff\xff\xff\xfe" + b"\x00" * 4), 0)
    # Produce v8: a topic name with int16 length -2.
    with pytest.raises(MalformedMessage):
        walker("ProduceResponse", 8, False).walk(memoryview(b"\x00\x00\x00\x01\xff\xfe" + b"\x00" * 8), 0)
    # Fetch v11: records with int32 length -5.
    body = encode(fetch_response(11, [2]), 11)
    records_len_at = len(body) - 2 - 4
    assert body[records_len_at : records_len_at + 4] == b"\x00\x00\x00\x02"
    patched = body[:records_len_at] + struct.pack(">i", -5) + body[records_len_at + 4 :]
    with pytest.raises(MalformedMessage):
        walker("FetchResponse", 11, False).walk(memoryview(patched), 0)


def test_null_arrays_and_strings_are_accepted() -> None:
    # Produce v8: responses null (-1), then throttle.
    body = b"\xff\xff\xff\xff" + struct.pack(">i", 5)
    assert walker("ProduceResponse", 8, False).walk(memoryview(body), 0).offsets["ThrottleTimeMs"] == 4
    # Produce v9: compact null array (0), throttle, empty tags.
    body = b"\x00" + struct.pack(">i", 5) + b"\x00"
    result = walker("ProduceResponse", 9, True).walk(memoryview(body), 0)
    assert result.offsets == {"Responses": 0, "ThrottleTimeMs": 1}
    assert result.tags_at == 5


def test_overlong_varint_is_malformed() -> None:
    body = b"\x80\x80\x80\x80\x80\x01" + struct.pack(">i", 5) + b"\x00"
    with pytest.raises(MalformedMessage):
        walker("ProduceResponse", 9, True).walk(memoryview(body), 0)


def test_walker_is_cached_per_message_and_version() -> None:
    assert walker("FetchResponse", 16, True) is walker("FetchResponse", 16, True)
    assert walker("FetchResponse", 16, True) is not walker("FetchResponse", 17, True)


def test_errors_are_protocol_errors() -> None:
    assert issubclass(TruncatedMessage, ProtocolError)
    assert issubclass(MalformedMessage, ProtocolError)


def test_walk_to_and_elements_give_the_offsets_a_splice_needs() -> None:
    brokers = [M.MetadataResponseBroker(node_id=n, host="h" * n, port=9000 + n, rack=None) for n in (1, 2)]
    msg = M(version=12, throttle_time_ms=7, brokers=brokers, cluster_id="c", controller_id=1, topics=[])
    body = memoryview(bytes(msg.encode(version=12)))
    w = walker("MetadataResponse", 12, True)
    whole = w.walk(body, 0)
    part = w.walk_to(body, 0, "Brokers")
    assert part.offsets == {"ThrottleTimeMs": 0, "Brokers": 4}
    assert part.span("Brokers") == whole.span("Brokers") == (4, whole.offsets["ClusterId"])
    # Two brokers: a count (3), then node id, compact host, port, null rack, no tags each.
    first, second = w.elements(body, part, "Brokers")
    assert (first.start, first.offsets["Host"], first.span("Host"), first.offsets["Port"], first.end) == (
        5, 9, (9, 11), 11, 17)
    assert (second.start, second.span("Host"), second.end) == (17, (21, 24), 30)
    assert w.compact("Brokers") and w.items("Brokers").compact("Host")


def test_around_skips_the_fields_on_either_side_of_one() -> None:
    brokers = [M.MetadataResponseBroker(node_id=n, host="h" * n, port=9000 + n, rack=None) for n in (1, 2)]
    msg = M(version=12, throttle_time_ms=7, brokers=brokers, cluster_id="c", controller_id=1, topics=[])
    body = memoryview(bytes(msg.encode(version=12)))
    w = walker("MetadataResponse", 12, True)
    whole = w.walk(body, 0)
    before, after = w.around("Brokers")
    start, end = whole.span("Brokers")
    assert before(body, 0) == start == 4
    assert after(body, end) == whole.end == len(body)  # ClusterId, ControllerId, Topics, the tags
    items = w.items("Brokers")
    host_before, host_after = items.around("Host")
    first = w.elements(body, whole, "Brokers")[0]
    assert (host_before(body, first.start), host_after(body, first.span("Host")[1])) == (
        first.offsets["Host"], first.end)
    assert items.field_names() == ["NodeId", "Host", "Port", "Rack"]
    assert items.field_type("Port") == "int32"
    assert (items.nullable("Rack"), items.nullable("Host")) == (True, False)
    with pytest.raises(TruncatedMessage):
        host_after(body[:first.end - 1], first.span("Host")[1])
