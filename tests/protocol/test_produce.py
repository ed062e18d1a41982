"""produce_acks: the acks of a Produce request, read without decoding its records."""

from __future__ import annotations

import struct
import uuid

import pytest
from kafka.protocol.producer.produce import ProduceRequest

from kafka_quota_proxy.protocol.errors import TruncatedMessage
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.produce import produce_acks

TD = ProduceRequest.TopicProduceData
PD = TD.PartitionProduceData


def produce_frame(version: int, acks: int, transactional_id: str | None, client_id: str | None = "producer-1",
                  records: bytes = b"\x00" * 70) -> bytes:
    topic = {"topic_id": uuid.UUID(int=1)} if version >= 13 else {"name": "orders"}
    req = ProduceRequest(version=version, transactional_id=transactional_id, acks=acks, timeout_ms=30_000,
                         topic_data=[TD(**topic, partition_data=[PD(index=0, records=records),
                                                                 PD(index=1, records=None)])])
    req.with_header(correlation_id=11, client_id=client_id)
    return bytes(req.encode(version=version, header=True, framed=True))


CASES = [
    (v, acks, tx)
    for v in (0, 2, 3, 8, 9, 13)
    for acks in (0, 1, -1)
    for tx in (None, "tx-1")
]


@pytest.mark.parametrize("version, acks, transactional_id", CASES)
def test_produce_acks(version: int, acks: int, transactional_id: str | None) -> None:
    frame = memoryview(produce_frame(version, acks, transactional_id))
    header = parse_request_header(frame)
    assert header.api_version == version
    assert produce_acks(frame, header.body_offset, version) == acks


@pytest.mark.parametrize("version", [0, 2])
def test_transactional_id_absent_before_v3(version: int) -> None:
    # The body starts with acks, whatever transactional id the object carries.
    frame = produce_frame(version, -1, "ignored")
    h = parse_request_header(memoryview(frame))
    assert frame[h.body_offset : h.body_offset + 2] == b"\xff\xff"


@pytest.mark.parametrize("version", [3, 8])
def test_non_flexible_transactional_id_layout(version: int) -> None:
    frame = produce_frame(version, 1, None)
    h = parse_request_header(memoryview(frame))
    assert frame[h.body_offset : h.body_offset + 4] == b"\xff\xff\x00\x01"  # null string, acks 1
    frame = produce_frame(version, 1, "tx-1")
    h = parse_request_header(memoryview(frame))
    assert frame[h.body_offset : h.body_offset + 8] == b"\x00\x04tx-1\x00\x01"


@pytest.mark.parametrize("version", [9, 13])
def test_flexible_transactional_id_layout(version: int) -> None:
    frame = produce_frame(version, 1, None)
    h = parse_request_header(memoryview(frame))
    assert frame[h.body_offset : h.body_offset + 3] == b"\x00\x00\x01"  # compact null, acks 1
    frame = produce_frame(version, 1, "tx-1")
    h = parse_request_header(memoryview(frame))
    assert frame[h.body_offset : h.body_offset + 7] == b"\x05tx-1\x00\x01"


@pytest.mark.parametrize("version", [3, 8, 9, 13])
@pytest.mark.parametrize("length", [0, 1, 126, 127, 128, 300, 20_000])
def test_transactional_id_lengths(version: int, length: int) -> None:
    # 126/127 straddle the one-byte compact length boundary (length + 1 = 127 / 128).
    tx = "t" * length
    for acks in (0, 1, -1):
        frame = memoryview(produce_frame(version, acks, tx))
        h = parse_request_header(frame)
        assert produce_acks(frame, h.body_offset, version) == acks


@pytest.mark.parametrize("version", [0, 3, 9, 13])
def test_null_and_utf8_client_ids_do_not_matter(version: int) -> None:
    for client_id in (None, "", "prodücer-\U0001f680"):
        frame = memoryview(produce_frame(version, -1, "tx", client_id=client_id))
        h = parse_request_header(frame)
        assert produce_acks(frame, h.body_offset, version) == -1


def test_hand_built_bodies() -> None:
    assert produce_acks(memoryview(b"\x00\x01"), 0, 0) == 1
    assert produce_acks(memoryview(b"\xff\xff"), 0, 2) == -1
    assert produce_acks(memoryview(b"\xff\xff\x00\x00"), 0, 3) == 0
    assert produce_acks(memoryview(b"\x00\x02ab\x00\x01"), 0, 8) == 1
    assert produce_acks(memoryview(b"\x00\xff\xff"), 0, 9) == -1  # compact null
    assert produce_acks(memoryview(b"\x01\x00\x01"), 0, 9) == 1  # compact empty string
    assert produce_acks(memoryview(b"\x03ab\x00\x00"), 0, 13) == 0
    long_id = b"x" * 200
    assert produce_acks(memoryview(b"\xc9\x01" + long_id + b"\xff\xff"), 0, 9) == -1
    # An offset into a larger buffer.
    assert produce_acks(memoryview(b"HEADER\x03ab\x00\x01rest"), 6, 10) == 1


@pytest.mark.parametrize("version", [0, 2, 3, 8, 9, 13])
def test_truncated_before_acks(version: int) -> None:
    frame = produce_frame(version, -1, "tx-1")
    h = parse_request_header(memoryview(frame))
    start = h.body_offset
    acks_end = start + 2 + (0 if version < 3 else (len("tx-1") + (1 if version >= 9 else 2)))
    assert struct.unpack_from(">h", frame, acks_end - 2)[0] == -1
    for n in range(start, acks_end):
        with pytest.raises(TruncatedMessage):
            produce_acks(memoryview(frame[:n]), start, version)
    assert produce_acks(memoryview(frame[:acks_end]), start, version) == -1


def test_transactional_id_longer_than_the_frame() -> None:
    with pytest.raises(TruncatedMessage):
        produce_acks(memoryview(b"\x00\x10abc"), 0, 3)
    with pytest.raises(TruncatedMessage):
        produce_acks(memoryview(b"\x11abc"), 0, 9)
    with pytest.raises(TruncatedMessage):
        produce_acks(memoryview(b"\x80"), 0, 9)  # varint cut short
