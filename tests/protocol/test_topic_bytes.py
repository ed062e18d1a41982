"""topic_bytes: each topic's record bytes in Produce requests and Fetch responses built by
kafka-python at every version, and the requests cut down to some topics and the responses with
some topics' records emptied, compared byte for byte with what kafka-python writes for them."""

from __future__ import annotations

import copy
import struct
import uuid
from functools import cache
from itertools import combinations
from typing import Any

import pytest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.producer.produce import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from kafka_quota_proxy.protocol.errors import MalformedMessage, TruncatedMessage
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.topic_bytes import (
    ProduceLayout,
    fetch_emptied,
    fetch_topics,
    produce_layout,
    produce_topics,
    produce_without,
)
from tests.support.encoding import compact_string, uvarint

TD = ProduceRequest.TopicProduceData
PD = TD.PartitionProduceData
FT = FetchResponse.FetchableTopicResponse
FP = FT.PartitionData

PRODUCE_VERSIONS = range(ProduceRequest.max_version + 1)
FETCH_VERSIONS = range(FetchResponse.max_version + 1)


@cache
def batch(magic: int, records: int, value_size: int = 8) -> bytes:
    """A real record batch (magic 2) or message set (magic 0 and 1), as producers send them."""
    b = MemoryRecordsBuilder(magic=magic, compression_type=0, batch_size=1_000_000)
    for i in range(records):
        b.append(timestamp=0, key=None, value=bytes([i % 256]) * value_size, headers=[])
    b.close()
    return bytes(b.buffer())


def topic_id(name: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_DNS, name)


# --- Produce -------------------------------------------------------------------------------------

LONG_NAME = "t" * 200  # its compact length (201) takes two bytes
IDENT = bytes(range(16))  # a topic id


def produce_data(version: int) -> list[tuple[str, list[tuple[int, bytes | None]]]]:
    """Three topics: (name, [(partition index, records)])."""
    magic = 2 if version >= 3 else 1
    return [
        ("orders", [(0, batch(magic, 3)), (2, None), (5, b"")]),
        (LONG_NAME, [(1, batch(magic, 2, value_size=300))]),  # a records length over 127
        ("événements", [(7, batch(magic, 1)), (3, batch(magic, 2))]),
    ]


def produce_frame(version: int, data: list[tuple[str, list[tuple[int, bytes | None]]]],
                  transactional_id: str | None = "tx-1") -> bytes:
    topics = [TD(name=name, topic_id=topic_id(name),
                 partition_data=[PD(index=i, records=r) for i, r in parts])
              for name, parts in data]
    req = ProduceRequest(version=version, transactional_id=transactional_id, acks=-1, timeout_ms=30_000,
                         topic_data=topics)
    req.with_header(correlation_id=11, client_id="producer-1")
    return bytes(req.encode(version=version, header=True, framed=True))


def layout_of(frame: bytes) -> tuple[memoryview, int, int, ProduceLayout]:
    view = memoryview(frame)
    header = parse_request_header(view)
    version = header.api_version
    return view, header.body_offset, version, produce_layout(view, header.body_offset, version)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_topics_at_every_version(version: int) -> None:
    data = produce_data(version)
    view, at, _, layout = layout_of(produce_frame(version, data))
    got = [(t.name, t.topic_id, t.size, t.partitions) for t in layout.topics]
    expected = [(None if version >= 13 else name, topic_id(name).bytes if version >= 13 else None,
                 sum(len(r or b"") for _, r in parts), tuple(i for i, _ in parts))
                for name, parts in data]
    assert got == expected
    assert produce_topics(view, at, version) == layout.topics


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_layout_offsets(version: int) -> None:
    # Independently of the walker: a request without topics ends in its count (and, flexible, the
    # top-level tagged fields, one byte); a request with one topic is the same with that topic's
    # entry in between (a count of 0 and of 1 take as many bytes).
    flexible = version >= 9
    tail_len = 1 if flexible else 0
    count_len = 1 if flexible else 4
    data = produce_data(version)
    empty = produce_frame(version, [])
    count_end = len(empty) - tail_len
    entries = [produce_frame(version, [topic])[count_end : -tail_len or None] for topic in data]

    frame = produce_frame(version, data)
    _, _, _, layout = layout_of(frame)
    assert (layout.count_at, layout.count_end) == (count_end - count_len, count_end)
    assert layout.tail_at == len(frame) - tail_len
    start = count_end
    for topic, entry in zip(layout.topics, entries, strict=True):
        assert (topic.start, topic.end) == (start, start + len(entry))
        assert frame[topic.start : topic.end] == entry
        start = topic.end
    assert start == layout.tail_at


def test_produce_layout_of_hand_built_bodies() -> None:
    # v0: acks 1, timeout_ms 5, [topic "ab": [partition 3: records "xy"]]
    body = (b"\x00\x01\x00\x00\x00\x05" + b"\x00\x00\x00\x01" + b"\x00\x02ab"
            + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x03" + b"\x00\x00\x00\x02xy")
    layout = produce_layout(memoryview(b"HEAD" + body), 4, 0)
    assert (layout.count_at, layout.count_end, layout.tail_at) == (10, 14, 32)
    [topic] = layout.topics
    assert (topic.name, topic.topic_id, topic.size, topic.partitions) == ("ab", None, 2, (3,))
    assert (topic.start, topic.end) == (14, 32)
    # v9: null transactional_id, acks -1, timeout_ms 0, [topic "ab": [partition 3: "xy", 4: null]]
    body = (b"\x00\xff\xff\x00\x00\x00\x00" + b"\x02" + compact_string("ab") + b"\x03"
            + b"\x00\x00\x00\x03" + b"\x03xy" + b"\x00" + b"\x00\x00\x00\x04" + b"\x00" + b"\x00"
            + b"\x00" + b"\x00")
    layout = produce_layout(memoryview(body), 0, 9)
    assert (layout.count_at, layout.count_end, layout.tail_at) == (7, 8, len(body) - 1)
    [topic] = layout.topics
    assert (topic.name, topic.size, topic.partitions, topic.start, topic.end) == ("ab", 2, (3, 4), 8, 27)
    # v13: the topic by id
    body = (b"\x00\x00\x01\x00\x00\x00\x00" + b"\x02" + IDENT + b"\x02" + b"\x00\x00\x00\x00" + b"\x01"
            + b"\x00\x00\x00")
    [topic] = produce_layout(memoryview(body), 0, 13).topics
    assert (topic.name, topic.topic_id, topic.size, topic.partitions) == (None, IDENT, 0, (0,))


def check_pieces(pieces: Pieces, source: bytes, new: int) -> None:
    """`new` pieces are new bytes; every other is a memoryview onto `source`, never a copy."""
    views = [p for p in pieces.parts if isinstance(p, memoryview)]
    assert len(pieces.parts) - len(views) == new
    assert all(v.obj is source for v in views)
    assert all(len(p) for p in pieces.parts)


def kept_only(version: int, keep: tuple[int, ...]) -> bytes:
    data = produce_data(version)
    return produce_frame(version, [data[i] for i in keep])


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@pytest.mark.parametrize("keep", [k for n in range(4) for k in combinations(range(3), n)])
def test_produce_without_is_the_request_of_the_kept_topics(version: int, keep: tuple[int, ...]) -> None:
    frame = produce_frame(version, produce_data(version))
    view, at, _, layout = layout_of(frame)
    pieces = produce_without(view, at, version, layout, list(keep))
    out = pieces.join()
    assert out == kept_only(version, keep)  # exactly what kafka-python writes for them
    assert struct.unpack_from(">i", out)[0] == len(out) - 4 == len(pieces) - 4
    check_pieces(pieces, frame, new=2)  # the size prefix and the topics' count
    decoded = ProduceRequest.decode(out, version=version, header=True, framed=True)
    assert (decoded.header.correlation_id, decoded.header.client_id) == (11, "producer-1")
    assert (decoded.acks, decoded.timeout_ms) == (-1, 30_000)
    assert decoded.transactional_id == ("tx-1" if version >= 3 else None)
    data = produce_data(version)
    expected = [(topic_id(data[i][0]) if version >= 13 else data[i][0], data[i][1]) for i in keep]
    got = [(t.topic_id if version >= 13 else t.name, [(p.index, p.records) for p in t.partition_data])
           for t in decoded.topic_data]
    assert got == expected


@pytest.mark.parametrize("version", [0, 8, 9, 13])
def test_produce_without_keeps_the_request_order(version: int) -> None:
    frame = produce_frame(version, produce_data(version))
    view, at, _, layout = layout_of(frame)
    out = produce_without(view, at, version, layout, [2, 0, 0, 9, -1]).join()
    assert out == kept_only(version, (0, 2))  # duplicates and unknown indexes change nothing


@pytest.mark.parametrize("version", [0, 8, 9, 13])
def test_produce_without_joins_adjacent_entries(version: int) -> None:
    frame = produce_frame(version, produce_data(version))
    view, at, _, layout = layout_of(frame)
    head = frame[4 : layout.count_at]
    parts = produce_without(view, at, version, layout, [0, 1, 2]).parts
    assert [bytes(p) for p in parts[1:]] == [head, frame[layout.count_at : layout.count_end],
                                            frame[layout.count_end :]]
    parts = produce_without(view, at, version, layout, [0, 2]).parts
    t = layout.topics
    assert [bytes(p) for p in parts[3:]] == [frame[t[0].start : t[0].end], frame[t[2].start :]]
    parts = produce_without(view, at, version, layout, []).parts
    assert len(parts) == (4 if version >= 9 else 3)  # size, head, count (, tagged fields)


@pytest.mark.parametrize("version", [8, 9, 13])
@pytest.mark.parametrize("kept", [0, 126, 127, 128, 130])
def test_produce_without_count_lengths(version: int, kept: int) -> None:
    # 130 topics: a compact count of 131 takes two bytes; 126 kept, one; 127 kept, two again.
    data: list[tuple[str, list[tuple[int, bytes | None]]]] = [
        (f"topic-{i}", [(i % 4, b"r" * (i % 3))]) for i in range(130)]
    frame = produce_frame(version, data)
    view, at, _, layout = layout_of(frame)
    assert len(layout.topics) == 130
    keep = list(range(0, 130, 2))[: kept // 2] + list(range(1, 130, 2))[: kept - kept // 2]
    out = produce_without(view, at, version, layout, keep).join()
    assert out == produce_frame(version, [data[i] for i in sorted(keep)])


@pytest.mark.parametrize("version", [0, 8, 9, 13])
def test_bytes_after_the_body_are_kept(version: int) -> None:
    # Kafka reads a body and ignores what follows it; so does the cut (protocol/well_formed.py).
    frame = produce_frame(version, produce_data(version))
    padded = struct.pack(">i", len(frame) - 4 + 3) + frame[4:] + b"xyz"
    view, at, _, layout = layout_of(padded)
    assert layout.tail_at == len(frame) - (1 if version >= 9 else 0)
    out = produce_without(view, at, version, layout, [1]).join()
    expected = kept_only(version, (1,))
    assert out == struct.pack(">i", len(expected) - 4 + 3) + expected[4:] + b"xyz"


@pytest.mark.parametrize("version", [0, 2, 3, 8, 9, 12, 13])
def test_produce_truncated_at_every_length(version: int) -> None:
    frame = produce_frame(version, produce_data(version))
    view, at, _, _ = layout_of(frame)
    for n in range(at, len(frame)):
        with pytest.raises(TruncatedMessage):
            produce_layout(view[:n], at, version)


@pytest.mark.parametrize("body, version, message", [
    (b"\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff", 0, "topic_data: null"),
    (b"\x00\x01\x00\x00\x00\x00\xff\xff\xff\xfe", 0, "topic_data: array length -2"),
    (b"\x00\x00\x01\x00\x00\x00\x00\x00", 9, "topic_data: null"),
    (b"\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\xff\xff", 2, "topic name: length -1"),
    (b"\x00\x00\x01\x00\x00\x00\x00\x02\x00", 9, "topic name: length -1"),
    (b"\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01\xff", 0, "not UTF-8"),
    (b"\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\xff\xff\xff\xff", 0, "partition_data: null"),
    (b"\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\xff\xff\xff\xfe",
     0, "records: length -2"),
    (b"\xff\xfe\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00", 3, "transactional_id: length -2"),
])
def test_malformed_produce_bodies(body: bytes, version: int, message: str) -> None:
    with pytest.raises(MalformedMessage, match=message):
        produce_layout(memoryview(body), 0, version)


def test_a_count_beyond_the_bytes_left_is_refused_before_the_walk() -> None:
    body = b"\x00\x01\x00\x00\x00\x00\x7f\xff\xff\xff" + b"\x00" * 64
    with pytest.raises(TruncatedMessage, match="an array of 2147483647, 64 bytes left"):
        produce_layout(memoryview(body), 0, 0)


# --- Fetch ---------------------------------------------------------------------------------------

ABORTED = [FP.AbortedTransaction(producer_id=7, first_offset=8),
           FP.AbortedTransaction(producer_id=9, first_offset=1)]
ENDPOINTS = [FetchResponse.NodeEndpoint(node_id=1, host="broker-1", port=9092, rack="a")]


def fetch_data() -> list[tuple[str, list[tuple[int, bytes | None]]]]:
    return [
        ("events", [(0, batch(2, 3)), (1, None), (2, b""), (4, batch(2, 2, value_size=300))]),
        (LONG_NAME, []),  # a topic without partitions
        ("logs", [(3, batch(2, 1))]),
        ("événements", [(9, batch(1, 2)), (8, batch(0, 1))]),
    ]


def fetch_response(version: int, emptied: frozenset[int] = frozenset()) -> Any:
    def part(index: int, records: bytes | None) -> Any:
        kw: dict[str, Any] = dict(partition_index=index, error_code=index % 3, high_watermark=500 + index,
                                  last_stable_offset=400, log_start_offset=3,
                                  aborted_transactions=None if index % 2 else ABORTED,
                                  preferred_read_replica=index, records=records)
        if version >= 12 and index % 2:
            kw["current_leader"] = FP.LeaderIdAndEpoch(leader_id=2, leader_epoch=4)
            kw["snapshot_id"] = FP.SnapshotId(end_offset=5, epoch=6)
        return FP(**kw)

    topics = [FT(topic=name, topic_id=topic_id(name),
                 partitions=[part(i, b"" if t in emptied else r) for i, r in parts])
              for t, (name, parts) in enumerate(fetch_data())]
    kw: dict[str, Any] = {"node_endpoints": ENDPOINTS} if version >= 16 else {}
    return FetchResponse(version=version, throttle_time_ms=0x01020304, error_code=0, session_id=1234,
                         responses=topics, **kw)


def fetch_body(version: int, emptied: frozenset[int] = frozenset()) -> bytes:
    return bytes(fetch_response(version, emptied).encode(version=version))


def records_field(records: bytes | None, flexible: bool) -> bytes:
    if flexible:
        return uvarint(0 if records is None else len(records) + 1) + (records or b"")
    return struct.pack(">i", -1 if records is None else len(records)) + (records or b"")


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_topics_at_every_version(version: int) -> None:
    body = fetch_body(version)
    layout = fetch_topics(memoryview(body), version)
    got = [(t.name, t.topic_id, t.size, [p.index for p in t.partitions]) for t in layout.topics]
    expected = [(None if version >= 13 else name, topic_id(name).bytes if version >= 13 else None,
                 sum(len(r or b"") for _, r in parts), [i for i, _ in parts])
                for name, parts in fetch_data()]
    assert got == expected
    for topic, (_, parts) in zip(layout.topics, fetch_data(), strict=True):
        for p, (_, records) in zip(topic.partitions, parts, strict=True):
            assert body[p.records_at : p.records_end] == records_field(records, version >= 12)
            assert p.size == len(records or b"")
    if version >= 12:  # the top-level tagged fields: none, or node_endpoints (tag 0)
        assert body[layout.tail_at] == (1 if version >= 16 else 0)


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_topic_entries(version: int) -> None:
    # Independently of the walker: each topic's entry is what a response of that topic alone
    # carries between the count and what follows the array.
    body = fetch_body(version)
    layout = fetch_topics(memoryview(body), version)
    alone = fetch_response(version)
    responses = alone.responses
    alone.responses = []
    empty = bytes(alone.encode(version=version))
    head = (4 if version >= 1 else 0) + (6 if version >= 7 else 0) + (1 if version >= 12 else 4)
    tail = len(empty) - head
    assert layout.tail_at == len(body) - tail
    start = head
    for topic, response in zip(layout.topics, responses, strict=True):
        alone.responses = [response]
        entry = bytes(alone.encode(version=version))[head : -tail or None]
        assert (topic.start, topic.end) == (start, start + len(entry))
        assert body[topic.start : topic.end] == entry
        start = topic.end
    assert start == layout.tail_at


def empty_records(response: Any, topics: frozenset[int]) -> Any:
    emptied = copy.deepcopy(response)
    for t in topics:
        for p in emptied.responses[t].partitions:
            p.records = b""
    return emptied


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@pytest.mark.parametrize("topics", [frozenset(k) for n in (0, 1, 2, 4) for k in combinations(range(4), n)])
def test_fetch_emptied_is_the_response_without_those_records(version: int, topics: frozenset[int]) -> None:
    body = fetch_body(version)
    layout = fetch_topics(memoryview(body), version)
    pieces = fetch_emptied(memoryview(body), version, layout, set(topics))
    out = pieces.join()
    assert out == fetch_body(version, topics)  # exactly what kafka-python writes for it
    partitions = sum(len(layout.topics[t].partitions) for t in topics)
    check_pieces(pieces, body, new=partitions)
    assert all(p == (b"\x01" if version >= 12 else b"\x00\x00\x00\x00")
               for p in pieces.parts if isinstance(p, bytes))
    original = FetchResponse.decode(body, version=version)
    assert FetchResponse.decode(out, version=version) == empty_records(original, topics)


@pytest.mark.parametrize("version", [0, 4, 11, 12, 16])
def test_fetch_emptied_of_no_topic_is_the_body(version: int) -> None:
    body = fetch_body(version)
    pieces = fetch_emptied(memoryview(body), version, fetch_topics(memoryview(body), version), set())
    assert len(pieces.parts) == 1 and pieces.join() == body


@pytest.mark.parametrize("version", [7, 11, 12, 16])
def test_fetch_aborted_transactions_with_tagged_fields(version: int) -> None:
    # Partition 0's aborted transaction carries an unknown tagged field (flexible versions), and
    # partition 1's aborted_transactions is null: both are skipped by their lengths.
    flexible = version >= 12
    tags = b"\x00" if flexible else b""

    def count(n: int) -> bytes:
        return uvarint(n + 1) if flexible else struct.pack(">i", n)

    def partition(index: int, aborted: bytes, records: bytes | None) -> bytes:
        replica = struct.pack(">i", -1) if version >= 11 else b""
        return (struct.pack(">ihqqq", index, 0, 10, 10, 0) + aborted + replica
                + records_field(records, flexible) + tags)

    def response(first: bytes | None, second: bytes | None) -> bytes:
        entry = struct.pack(">qq", 7, 8) + (b"\x01\x05\x02hi" if flexible else b"")
        name = IDENT if version >= 13 else compact_string("t") if flexible else b"\x00\x01t"
        return (struct.pack(">ihi", 0, 0, 0) + count(1) + name + count(2)
                + partition(0, count(1) + entry, first) + partition(1, count(-1), second) + tags + tags)

    body = response(b"abc", None)
    layout = fetch_topics(memoryview(body), version)
    [topic] = layout.topics
    assert (topic.name, topic.topic_id, topic.size) == (("t", None) if version < 13 else (None, IDENT)) + (3,)
    assert [(p.index, p.size, p.records_end - p.records_at) for p in topic.partitions] == [
        (0, 3, 4 if flexible else 7), (1, 0, 1 if flexible else 4)]
    assert fetch_emptied(memoryview(body), version, layout, {0}).join() == response(b"", b"")


@pytest.mark.parametrize("version", [0, 1, 4, 7, 11, 12, 13, 16, 18])
def test_fetch_truncated_at_every_length(version: int) -> None:
    body = memoryview(fetch_body(version))
    for n in range(len(body)):
        with pytest.raises(TruncatedMessage):
            fetch_topics(body[:n], version)


ONE_TOPIC_ONE_PARTITION = b"\x00\x00\x00\x01" + b"\x00\x00" + b"\x00\x00\x00\x01"  # topic "", v0-11


@pytest.mark.parametrize("body, version, message", [
    (b"\xff\xff\xff\xff", 0, "responses: null"),
    (b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", 12, "responses: null"),
    (b"\x00\x00\x00\x01\xff\xff", 0, "topic name: length -1"),
    (b"\x00\x00\x00\x01\x00\x00\xff\xff\xff\xff", 0, "partitions: null"),
    (ONE_TOPIC_ONE_PARTITION + b"\x00" * 14 + b"\xff\xff\xff\xfe", 0, "records: length -2"),
    (b"\x00" * 4 + ONE_TOPIC_ONE_PARTITION + b"\x00" * 30 + b"\xff\xff\xff\xfe", 5,
     "aborted_transactions: array length -2"),
])
def test_malformed_fetch_bodies(body: bytes, version: int, message: str) -> None:
    with pytest.raises(MalformedMessage, match=message):
        fetch_topics(memoryview(body), version)


def test_records_at_finds_each_idempotent_batch_sequence() -> None:
    from kafka.protocol.producer.produce import ProduceRequest as Request
    from kafka.record.memory_records import MemoryRecordsBuilder as Builder

    from kafka_quota_proxy.protocol.produce import batch_sequence

    def batch(pid: int, sequence: int) -> bytes:
        b = Builder(magic=2, compression_type=0, batch_size=10**6)
        if pid >= 0:
            b.set_producer_state(pid, 3, sequence, False)
        b.append(timestamp=0, key=None, value=b"v", headers=[])
        b.close()
        return bytes(b.buffer())

    t = Request.TopicProduceData
    partitions = [t.PartitionProduceData(index=0, records=batch(7, 40)),
                  t.PartitionProduceData(index=1, records=batch(-1, 0)),
                  t.PartitionProduceData(index=2, records=None)]
    msg = Request(version=9, transactional_id=None, acks=-1, timeout_ms=1,
                  topic_data=[t(name="a", partition_data=partitions)])
    body = bytes(msg.encode(version=9))
    frame = memoryview(b"\0" * 4 + body)
    (topic,) = produce_layout(frame, 4, 9).topics
    assert [batch_sequence(frame, at) for at in topic.records_at] == [(7, 3, 40), None, None]
    assert topic.records_at[2] == -1
