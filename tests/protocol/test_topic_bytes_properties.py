"""Properties of topic_bytes at every version: each topic's record bytes read back as kafka-python
wrote them; a Produce request cut to some topics and a Fetch response with some topics' records
emptied are what kafka-python writes for those messages; damaged or arbitrary bytes raise only
ProtocolError, and whatever of them walks is cut and emptied into bytes that walk the same."""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.producer.produce import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.topic_bytes import (
    fetch_emptied,
    fetch_topics,
    produce_layout,
    produce_without,
)
from tests.support.messages import message
from tests.support.mutations import mutated

TD = ProduceRequest.TopicProduceData
PD = TD.PartitionProduceData
PRODUCE_VERSIONS = st.integers(0, ProduceRequest.max_version)
FETCH_VERSIONS = st.integers(0, FetchResponse.max_version)


def _batch(magic: int, records: int) -> bytes:
    b = MemoryRecordsBuilder(magic=magic, compression_type=0, batch_size=1_000_000)
    for i in range(records):
        b.append(timestamp=0, key=None, value=b"v" * (60 * i), headers=[])
    b.close()
    return bytes(b.buffer())


# Built once: building a batch costs more than walking a whole request. Up to ~190 bytes each, so
# that two of them cross a compact length's one-byte boundary (127).
BATCHES = [_batch(magic, n) for magic in (0, 1, 2) for n in (1, 3)]
records = st.none() | st.lists(st.sampled_from(BATCHES), max_size=2).map(b"".join)
partitions = st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), records), max_size=3)
produce_data = st.lists(st.tuples(st.text(max_size=8), partitions), max_size=4)


@dataclass(frozen=True)
class ProduceCase:
    version: int
    data: list[tuple[str, list[tuple[int, bytes | None]]]]
    transactional_id: str | None
    frame: bytes


def produce_frame(version: int, data: list[tuple[str, list[tuple[int, bytes | None]]]],
                  transactional_id: str | None, keep: set[int] | None = None) -> bytes:
    """The request of `data`'s topics (those at the indexes in `keep`, if given); the topic at
    index i has the id i + 1."""
    topics = [TD(name=name, topic_id=uuid.UUID(int=i + 1),
                 partition_data=[PD(index=p, records=r) for p, r in parts])
              for i, (name, parts) in enumerate(data) if keep is None or i in keep]
    req = ProduceRequest(version=version, transactional_id=transactional_id, acks=1, timeout_ms=100,
                         topic_data=topics)
    req.with_header(correlation_id=7, client_id="c")
    return bytes(req.encode(version=version, header=True, framed=True))


@st.composite
def produce_requests(draw: st.DrawFn) -> ProduceCase:
    version = draw(PRODUCE_VERSIONS)
    data = draw(produce_data)
    transactional_id = draw(st.none() | st.text(max_size=8)) if version >= 3 else None
    return ProduceCase(version, data, transactional_id, produce_frame(version, data, transactional_id))


@given(produce_requests(), st.data())
def test_produce_topics_and_cut_match_kafka_python(case: ProduceCase, data: st.DataObject) -> None:
    view = memoryview(case.frame)
    at = parse_request_header(view).body_offset
    layout = produce_layout(view, at, case.version)
    by_id = case.version >= 13
    assert [(t.name, t.topic_id, t.size, t.partitions) for t in layout.topics] == [
        (None if by_id else name, uuid.UUID(int=i + 1).bytes if by_id else None,
         sum(len(r or b"") for _, r in parts), tuple(p for p, _ in parts))
        for i, (name, parts) in enumerate(case.data)]
    keep = data.draw(st.sets(st.integers(0, len(case.data) - 1)) if case.data else st.just(set[int]()))
    out = produce_without(view, at, case.version, layout, list(keep)).join()
    assert out == produce_frame(case.version, case.data, case.transactional_id, keep)


def _walked(layout: Any) -> list[tuple[Any, ...]]:
    return [(t.name, t.topic_id, t.size, t.partitions) for t in layout.topics]


def cut_all_ways(frame: bytes, version: int, keep: set[int]) -> None:
    """Walk `frame`; if it walks, cut it to `keep` and walk the cut: the kept topics, unchanged."""
    view = memoryview(frame)
    try:
        at = parse_request_header(view).body_offset
    except ProtocolError:
        at = min(len(frame), 14)
    try:
        layout = produce_layout(view, at, version)
    except ProtocolError:
        return
    out = produce_without(view, at, version, layout, list(keep)).join()
    assert int.from_bytes(out[:4], "big") == len(out) - 4
    again = produce_layout(memoryview(out), at, version)
    assert _walked(again) == [w for i, w in enumerate(_walked(layout)) if i in keep]


@st.composite
def damaged_produce(draw: st.DrawFn) -> tuple[bytes, int, set[int]]:
    case = draw(produce_requests())
    return draw(mutated(case.frame)), case.version, draw(st.sets(st.integers(0, 4)))


@given(damaged_produce())
def test_damaged_requests_raise_only_protocol_errors(case: tuple[bytes, int, set[int]]) -> None:
    cut_all_ways(*case)


@given(st.binary(max_size=120), PRODUCE_VERSIONS, st.sets(st.integers(0, 4)))
def test_arbitrary_request_bodies_raise_only_protocol_errors(body: bytes, version: int,
                                                             keep: set[int]) -> None:
    # Behind a valid header, so that the body itself is what the walker sees.
    head = produce_frame(version, [], None)
    at = parse_request_header(memoryview(head)).body_offset
    cut_all_ways(head[:at] + body, version, keep)


# --- Fetch ---------------------------------------------------------------------------------------

responses = FETCH_VERSIONS.flatmap(lambda v: st.tuples(st.just(v), message(FetchResponse, v)))


@given(responses, st.data())
def test_fetch_topics_and_emptied_match_kafka_python(case: tuple[int, Any], data: st.DataObject) -> None:
    version, msg = case
    body = bytes(msg.encode(version=version))
    layout = fetch_topics(memoryview(body), version)
    by_id = version >= 13
    assert [(t.name, t.topic_id, t.size, [p.index for p in t.partitions]) for t in layout.topics] == [
        (None if by_id else t.topic, t.topic_id.bytes if by_id else None,
         sum(len(p.records or b"") for p in t.partitions), [p.partition_index for p in t.partitions])
        for t in msg.responses]
    for topic, t in zip(layout.topics, msg.responses, strict=True):
        for p, part in zip(topic.partitions, t.partitions, strict=True):
            assert p.size == len(part.records or b"")
            assert body[p.records_end - p.size : p.records_end] == (part.records or b"")
    emptied = data.draw(st.sets(st.integers(0, max(len(msg.responses) - 1, 0))))
    out = fetch_emptied(memoryview(body), version, layout, emptied).join()
    expected = copy.deepcopy(msg)
    for t in emptied & set(range(len(msg.responses))):
        for part in expected.responses[t].partitions:
            part.records = b""
    assert out == bytes(expected.encode(version=version))


def empty_all_ways(body: bytes, version: int, emptied: set[int]) -> None:
    """Walk `body`; if it walks, empty the topics in `emptied` and walk the result: the same
    topics and partitions, those emptied with no record bytes."""
    try:
        layout = fetch_topics(memoryview(body), version)
    except ProtocolError:
        return
    out = fetch_emptied(memoryview(body), version, layout, emptied).join()
    again = fetch_topics(memoryview(out), version)
    assert [(t.name, t.topic_id, [p.index for p in t.partitions]) for t in again.topics] == [
        (t.name, t.topic_id, [p.index for p in t.partitions]) for t in layout.topics]
    sizes = [0 if i in emptied else t.size for i, t in enumerate(layout.topics)]
    assert [t.size for t in again.topics] == sizes


@st.composite
def damaged_responses(draw: st.DrawFn) -> tuple[bytes, int, set[int]]:
    version, msg = draw(responses)
    return draw(mutated(bytes(msg.encode(version=version)))), version, draw(st.sets(st.integers(0, 3)))


@given(damaged_responses())
def test_damaged_responses_raise_only_protocol_errors(case: tuple[bytes, int, set[int]]) -> None:
    empty_all_ways(*case)


@given(st.binary(max_size=120), FETCH_VERSIONS, st.sets(st.integers(0, 3)))
def test_arbitrary_response_bodies_raise_only_protocol_errors(body: bytes, version: int,
                                                              emptied: set[int]) -> None:
    empty_all_ways(body, version, emptied)
