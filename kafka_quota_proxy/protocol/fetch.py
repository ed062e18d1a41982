"""Reading Fetch requests and building Kafka's throttled Fetch response, without decoding records."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kafka.protocol.consumer.fetch import FetchResponse

from kafka_quota_proxy.protocol.primitives import INT32, need
from kafka_quota_proxy.protocol.walk import tagged_fields, walker

REPLICA_STATE_TAG = 1  # v15+: the replica id moved into a tagged ReplicaState struct


@dataclass(slots=True)
class FetchRequestInfo:
    """What the proxy reads from a Fetch request without decoding it whole."""

    replica_id: int
    max_wait_ms: int
    max_bytes_at: int | None  # offset of max_bytes inside the frame (v3+), for capping in place
    max_bytes: int | None


_LEADING = struct.Struct(">ii")  # replica_id, max_wait_ms
_LEADING_V3 = struct.Struct(">iiii")  # replica_id, max_wait_ms, min_bytes, max_bytes


def read_fetch_request(frame: memoryview, body_offset: int, version: int) -> FetchRequestInfo:
    if version < 15:
        # Up to v14 the fields read here lead the body at fixed places, so nothing is walked:
        # walking the topics took ~60% of a fetch's quota charge (bench.quota_cost). The rest of
        # the request has been checked by then (WellFormed, protocol/well_formed.py).
        if version >= 3:
            need(frame, body_offset, _LEADING_V3.size)
            replica_id, max_wait_ms, _, max_bytes = _LEADING_V3.unpack_from(frame, body_offset)
            return FetchRequestInfo(replica_id, max_wait_ms, body_offset + 12, max_bytes)
        need(frame, body_offset, _LEADING.size)
        replica_id, max_wait_ms = _LEADING.unpack_from(frame, body_offset)
        return FetchRequestInfo(replica_id, max_wait_ms, None, None)
    # v15+: the replica id moved into a tagged field after the topics (ReplicaState), so the body
    # is walked to find it: a follower's fetch is exempt.
    body = frame[body_offset:]
    result = walker("FetchRequest", version, True).walk(body, 0)
    offsets = result.offsets
    replica_id = -1
    if "ReplicaId" in offsets:
        replica_id = int(INT32.unpack_from(body, offsets["ReplicaId"])[0])
    else:
        tags = tagged_fields(body, result.tags_at)
        if REPLICA_STATE_TAG in tags:
            start, end = tags[REPLICA_STATE_TAG]
            need(body[:end], start, 4)  # the tag's own size bounds it, not the body's
            replica_id = int(INT32.unpack_from(body, start)[0])
    max_wait_ms = int(INT32.unpack_from(body, offsets["MaxWaitMs"])[0])
    max_bytes_at = max_bytes = None
    if "MaxBytes" in offsets:
        max_bytes_at = body_offset + offsets["MaxBytes"]
        max_bytes = int(INT32.unpack_from(body, offsets["MaxBytes"])[0])
    return FetchRequestInfo(replica_id, max_wait_ms, max_bytes_at, max_bytes)


def session_id(body: memoryview, version: int) -> int:
    """The session id of a Fetch response (v7+: after throttle_time_ms and error_code)."""
    if version < 7:
        return 0
    need(body, 6, 4)  # a broker's body too short for it is a protocol error, not a crash
    return int(INT32.unpack_from(body, 6)[0])


def throttled_response_body(version: int, throttle_ms: int, session: int) -> bytes:
    """Kafka's throttled Fetch response: no partitions, error NONE, the session kept."""
    msg = FetchResponse(version=version, throttle_time_ms=throttle_ms, error_code=0,
                        session_id=session, responses=[])
    return bytes(msg.encode(version=version))
