"""Properties of the Produce request walkers (acks, record sets, producer ids) at every version:
what kafka-python encodes is read back exactly, and damaged or arbitrary bytes raise only
ProtocolError."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cache

from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.producer.produce import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.produce import produce_acks, producer_ids, record_sets
from tests.support.mutations import mutated

P = ProduceRequest.TopicProduceData
MAX_VERSION = ProduceRequest.max_version


@dataclass(frozen=True)
class Batch:
    pid: int | None  # None: not idempotent (producer id -1)
    magic: int
    records: int

    def encode(self) -> bytes:
        return _encoded(self)


@cache  # building a batch costs more than walking a whole request
def _encoded(batch: Batch) -> bytes:
    b = MemoryRecordsBuilder(magic=batch.magic, compression_type=0, batch_size=1_000_000)
    if batch.pid is not None:
        b.set_producer_state(batch.pid, 0, 0, False)
    for i in range(batch.records):
        b.append(timestamp=0, key=None, value=b"v%d" % i, headers=[])
    b.close()
    return bytes(b.buffer())


PIDS = [0, 1, 4242, 2**31 - 1, 2**31, 2**63 - 1]  # few, so that built batches are reused
batches = st.builds(Batch, st.none() | st.sampled_from(PIDS), st.sampled_from([2, 2, 2, 1, 0]),
                    st.integers(1, 3)).map(lambda b: b if b.magic == 2 else Batch(None, b.magic, b.records))
# A partition's records: absent (null), empty, or one or more batches back to back.
record_sets_of = st.none() | st.lists(batches, max_size=3)
topics = st.lists(st.tuples(st.text(max_size=8), st.lists(record_sets_of, max_size=3)), max_size=3)


@dataclass(frozen=True)
class ProduceCase:
    version: int
    acks: int
    frame: bytes
    sets: list[bytes]  # the non-empty record sets, in order
    ids: list[int]


@st.composite
def produce_requests(draw: st.DrawFn) -> ProduceCase:
    version = draw(st.integers(0, MAX_VERSION))
    acks = draw(st.integers(-(2**15), 2**15 - 1))
    data = draw(topics)
    sets: list[bytes] = []
    ids: list[int] = []
    topic_data = []
    for i, (name, partitions) in enumerate(data):
        parts = []
        for j, chosen in enumerate(partitions):
            records = None if chosen is None else b"".join(b.encode() for b in chosen)
            parts.append(P.PartitionProduceData(index=j, records=records))
            if records:
                sets.append(records)
                ids += [b.pid for b in chosen or () if b.pid is not None]
        topic_data.append(P(name=name, topic_id=uuid.UUID(int=i + 1), partition_data=parts))
    transactional_id = draw(st.none() | st.text(max_size=8)) if version >= 3 else None
    req = ProduceRequest(transactional_id=transactional_id, acks=acks,
                         timeout_ms=draw(st.integers(0, 2**31 - 1)), topic_data=topic_data)
    req.with_header(correlation_id=draw(st.integers(0, 2**31 - 1)), client_id="c")
    frame = bytes(req.encode(version=version, header=True, framed=True))
    return ProduceCase(version, acks, frame, sets, ids)


@given(produce_requests())
def test_walkers_read_back_what_kafka_python_wrote(case: ProduceCase) -> None:
    frame = memoryview(case.frame)
    at = parse_request_header(frame).body_offset
    assert produce_acks(frame, at, case.version) == case.acks
    assert [bytes(s) for s in record_sets(frame, at, case.version)] == case.sets
    assert producer_ids(frame, at, case.version) == case.ids


def walk_all(frame: bytes, version: int) -> None:
    view = memoryview(frame)
    try:
        at = parse_request_header(view).body_offset
    except ProtocolError:
        at = min(len(frame), 14)
    for call in (lambda: produce_acks(view, at, version), lambda: list(record_sets(view, at, version)),
                 lambda: producer_ids(view, at, version)):
        try:
            call()
        except ProtocolError:
            pass


@st.composite
def damaged_produce(draw: st.DrawFn) -> tuple[bytes, int]:
    case = draw(produce_requests())
    return draw(mutated(case.frame)), case.version


@given(damaged_produce())
def test_damaged_requests_raise_only_protocol_errors(case: tuple[bytes, int]) -> None:
    walk_all(*case)


@given(st.binary(max_size=120), st.integers(0, MAX_VERSION))
def test_arbitrary_bodies_raise_only_protocol_errors(body: bytes, version: int) -> None:
    # Behind a valid header, so that the body itself is what the walkers see.
    req = ProduceRequest(transactional_id=None, acks=1, timeout_ms=0, topic_data=[])
    req.with_header(correlation_id=1, client_id="c")
    head = bytes(req.encode(version=version, header=True, framed=True))
    at = parse_request_header(memoryview(head)).body_offset
    walk_all(head[:at] + body, version)
