"""Reading Produce requests without decoding their records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kafka.protocol.producer.produce import ProduceResponse

from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.protocol.primitives import (
    INT16,
    INT32,
    INT64,
    need,
    read_length,
    read_uvarint,
    skip_tagged_fields,
)


def produce_acks(frame: memoryview, body_offset: int, version: int) -> int:
    """The request's acks. From v3 a transactional_id (nullable string) comes first."""
    pos = body_offset
    if version >= 3:
        if version >= 9:  # flexible: compact nullable string, length + 1
            n, pos = read_uvarint(frame, pos)
            pos += max(n - 1, 0)
        else:
            need(frame, pos, 2)
            (n,) = INT16.unpack_from(frame, pos)
            pos += 2 + max(n, 0)
    need(frame, pos, 2)
    return int(INT16.unpack_from(frame, pos)[0])


# Record batch (magic 2) header: baseOffset int64, batchLength int32, partitionLeaderEpoch int32,
# magic int8, crc uint32, attributes int16, lastOffsetDelta int32, baseTimestamp int64,
# maxTimestamp int64, producerId int64, ... 61 bytes in all.
BATCH_LENGTH_AT = 8
MAGIC_AT = 16
PRODUCER_ID_AT = 43
BATCH_HEADER = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: batchLength counts the bytes after them


def _skip_string(frame: memoryview, pos: int, compact: bool) -> int:
    n, pos = read_length(frame, pos, compact, INT16)
    if n > 0:
        need(frame, pos, n)
        pos += n
    return pos


def record_sets(frame: memoryview, body_offset: int, version: int) -> Iterator[memoryview]:
    """Each partition's records in a Produce request, as views into the frame (no copy)."""
    flexible = version >= 9
    pos = body_offset
    if version >= 3:
        pos = _skip_string(frame, pos, flexible)  # transactional_id
    pos += 6  # acks int16, timeout_ms int32
    topics, pos = read_length(frame, pos, flexible)
    for _ in range(max(topics, 0)):
        if version >= 13:
            need(frame, pos, 16)
            pos += 16  # topic_id
        else:
            pos = _skip_string(frame, pos, flexible)
        partitions, pos = read_length(frame, pos, flexible)
        for _ in range(max(partitions, 0)):
            need(frame, pos, 4)
            pos += 4  # index
            size, pos = read_length(frame, pos, flexible)  # bytes share the array's length form
            if size > 0:
                need(frame, pos, size)
                yield frame[pos:pos + size]
                pos += size
            if flexible:
                pos = skip_tagged_fields(frame, pos)
        if flexible:
            pos = skip_tagged_fields(frame, pos)


def producer_ids(frame: memoryview, body_offset: int, version: int) -> list[int]:
    """The producer ids of a Produce request's record batches, read from each batch header;
    batches without one (id -1: not idempotent) and pre-magic-2 message sets are skipped."""
    ids: list[int] = []
    for records in record_sets(frame, body_offset, version):
        pos, end = 0, len(records)
        while pos + MAGIC_AT < end:
            (length,) = INT32.unpack_from(records, pos + BATCH_LENGTH_AT)
            magic = records[pos + MAGIC_AT]
            # Old message sets (magic 0/1) have the magic byte at the same place but shorter
            # entries and no producer id.
            if length < (BATCH_HEADER - LOG_OVERHEAD if magic == 2 else 0):
                raise MalformedMessage(f"record batch length {length}")
            if pos + LOG_OVERHEAD + length > end:
                raise MalformedMessage("record batch runs past its record set")
            if magic == 2:
                (pid,) = INT64.unpack_from(records, pos + PRODUCER_ID_AT)
                if pid >= 0:
                    ids.append(pid)
            pos += LOG_OVERHEAD + length
    return ids


PRODUCER_EPOCH_AT = 51  # int16, after the producer id
BASE_SEQUENCE_AT = 53  # int32


def batch_sequence(frame: memoryview, records_at: int) -> tuple[int, int, int] | None:
    """(producer id, producer epoch, base sequence) of the first record batch at `records_at`
    in `frame`, if it is an idempotent batch (magic 2, producer id >= 0); else None."""
    if records_at < 0 or len(frame) < records_at + BATCH_HEADER or frame[records_at + MAGIC_AT] != 2:
        return None
    (pid,) = INT64.unpack_from(frame, records_at + PRODUCER_ID_AT)
    if pid < 0:
        return None
    (epoch,) = INT16.unpack_from(frame, records_at + PRODUCER_EPOCH_AT)
    (sequence,) = INT32.unpack_from(frame, records_at + BASE_SEQUENCE_AT)
    return int(pid), int(epoch), int(sequence)


def refusal(request: Any, version: int, error_code: int, message: str, throttle_ms: int) -> bytes:
    """A ProduceResponse body failing every partition of a decoded `request` with `error_code`
    (and `message`, from v8), carrying `throttle_ms` (from v1)."""
    topic = ProduceResponse.TopicProduceResponse
    part = topic.PartitionProduceResponse
    responses = [topic(name=t.name if version < 13 else None, topic_id=t.topic_id if version >= 13 else None,
                       partition_responses=[part(index=p.index, error_code=error_code, base_offset=-1,
                                                 log_append_time_ms=-1, log_start_offset=-1, record_errors=[],
                                                 error_message=message, current_leader=None)
                                            for p in t.partition_data])
                 for t in request.topic_data]
    return bytes(ProduceResponse(version=version, throttle_time_ms=throttle_ms, responses=responses,
                                 node_endpoints=[]).encode(version=version))
