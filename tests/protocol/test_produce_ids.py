"""Producer ids read from Produce requests' record batch headers, without decoding records."""

from __future__ import annotations

import uuid

import pytest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.produce import producer_ids, record_sets

P = ProduceRequest.TopicProduceData


def batch(pid: int | None, records: int = 3, magic: int = 2, transactional: bool = False) -> bytes:
    b = MemoryRecordsBuilder(magic=magic, compression_type=0, batch_size=1_000_000)
    if pid is not None:
        b.set_producer_state(pid, 5, 0, transactional)
    for i in range(records):
        b.append(timestamp=None, key=None, value=b"value-%d" % i, headers=[])
    b.close()
    return bytes(b.buffer())


def request(version: int, topics: list[tuple[str, list[bytes | None]]]) -> tuple[memoryview, int]:
    req = ProduceRequest(transactional_id="tx" if version >= 3 else None, acks=-1, timeout_ms=1000,
                         topic_data=[P(name=name, topic_id=uuid.UUID(int=i + 1), partition_data=[
                             P.PartitionProduceData(index=j, records=r) for j, r in enumerate(parts)])
                             for i, (name, parts) in enumerate(topics)])
    req.with_header(correlation_id=1, client_id="c")
    frame = memoryview(req.encode(version=version, header=True, framed=True))
    return frame, parse_request_header(frame).body_offset


VERSIONS = [3, 4, 7, 8, 9, 10, 11, 12, 13]


@pytest.mark.parametrize("version", VERSIONS)
def test_ids_from_every_batch_of_every_partition_in_order(version: int) -> None:
    frame, at = request(version, [("a", [batch(7) + batch(9), batch(None)]),
                                  ("b", [None, batch(2**40, transactional=True)])])
    assert producer_ids(frame, at, version) == [7, 9, 2**40]


@pytest.mark.parametrize("version", VERSIONS)
def test_record_sets_are_views_of_the_frame(version: int) -> None:
    one, two = batch(1), batch(2) + batch(3)
    frame, at = request(version, [("t", [one, two])])
    sets = list(record_sets(frame, at, version))
    assert [bytes(s) for s in sets] == [one, two]
    assert all(s.obj is frame.obj for s in sets)


def test_non_idempotent_and_old_format_batches_have_no_id() -> None:
    frame, at = request(8, [("t", [batch(None), batch(None, magic=1), batch(None, magic=0)])])
    assert producer_ids(frame, at, 8) == []


def test_empty_request() -> None:
    frame, at = request(9, [])
    assert producer_ids(frame, at, 9) == []


@pytest.mark.parametrize("version", [8, 9, 13])
def test_truncated_request_is_a_protocol_error(version: int) -> None:
    frame, at = request(version, [("t", [batch(11)])])
    for cut in (at + 3, at + 10, len(frame) - 30):
        with pytest.raises(ProtocolError):
            producer_ids(frame[:cut], at, version)


def test_a_batch_length_too_small_for_a_header_is_refused() -> None:
    bad = bytearray(batch(11))
    bad[8:12] = (10).to_bytes(4, "big")  # batchLength below the 49 bytes a header needs
    frame, at = request(8, [("t", [bytes(bad)])])
    with pytest.raises(ProtocolError):
        producer_ids(frame, at, 8)


def test_a_batch_running_past_its_record_set_is_refused() -> None:
    frame, at = request(9, [("t", [batch(11)[:-5]])])  # the record set ends inside the batch
    with pytest.raises(ProtocolError):
        producer_ids(frame, at, 9)
