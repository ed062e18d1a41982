"""Reading KIP-932 ShareFetch requests and responses where the quotas need them, and building
Kafka's throttled ShareFetch response, without decoding records.

Every ShareFetch version is flexible, and its leading fields come in a fixed order: a request
opens with GroupId and MemberId (compact nullable strings), then ShareSessionEpoch, MaxWaitMs,
MinBytes and MaxBytes (int32 each); a response opens with ThrottleTimeMs, ErrorCode,
ErrorMessage (compact nullable string) and, from v1, AcquisitionLockTimeoutMs. So the fields read
here are found by skipping two strings at most; the topics are never walked.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_quota_proxy.protocol.api_keys import SHARE_FETCH
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.error_codes import INVALID_SHARE_SESSION_EPOCH, NONE
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.protocol.primitives import INT16, INT32, need, read_uvarint

ACQUISITION_LOCK_FROM = 1  # ShareFetchResponse.json: AcquisitionLockTimeoutMs "versions": "1+"


@dataclass(slots=True)
class ShareFetchRequestInfo:
    """What the proxy reads from a ShareFetch request without decoding it whole."""

    max_wait_ms: int
    max_bytes_at: int  # offset of MaxBytes inside the frame, for capping in place
    max_bytes: int


@dataclass(slots=True)
class ShareFetchResponseHead:
    """The leading fields of a ShareFetch response."""

    throttle_time_ms: int
    error_code: int
    acquisition_lock_timeout_ms: int  # 0 before v1, which has no such field


def _skip_compact_nullable_string(buf: memoryview, pos: int) -> int:
    n, pos = read_uvarint(buf, pos)
    if n > 0:
        need(buf, pos, n - 1)
        pos += n - 1
    return pos


def read_share_fetch_request(frame: memoryview, body_offset: int) -> ShareFetchRequestInfo:
    pos = _skip_compact_nullable_string(frame, body_offset)  # GroupId
    pos = _skip_compact_nullable_string(frame, pos)  # MemberId
    need(frame, pos, 16)  # ShareSessionEpoch, MaxWaitMs, MinBytes, MaxBytes
    max_wait_ms = int(INT32.unpack_from(frame, pos + 4)[0])
    max_bytes = int(INT32.unpack_from(frame, pos + 12)[0])
    return ShareFetchRequestInfo(max_wait_ms, pos + 12, max_bytes)


def read_share_fetch_head(body: memoryview, version: int) -> ShareFetchResponseHead:
    need(body, 0, 6)
    throttle_ms = int(INT32.unpack_from(body, 0)[0])
    error_code = int(INT16.unpack_from(body, 4)[0])
    lock_ms = 0
    if version >= ACQUISITION_LOCK_FROM:
        pos = _skip_compact_nullable_string(body, 6)  # ErrorMessage
        need(body, pos, 4)
        lock_ms = int(INT32.unpack_from(body, pos)[0])
    return ShareFetchResponseHead(throttle_ms, error_code, lock_ms)


def throttled_share_fetch_body(version: int, throttle_ms: int, error_code: int,
                               acquisition_lock_timeout_ms: int) -> bytes:
    """Kafka's throttled ShareFetch response (ShareSessionContext.throttleResponse, then
    KafkaApis.processShareFetchResponse's createResponse): no topics, no node endpoints, error
    NONE, or INVALID_SHARE_SESSION_EPOCH where the session's epoch had moved (`error_code`, the
    broker's own), and the group's record lock duration."""
    if error_code not in (NONE, INVALID_SHARE_SESSION_EPOCH):
        raise MalformedMessage(f"a throttled ShareFetch carries no error {error_code}")
    cls = codec()[SHARE_FETCH].response
    msg = cls(version=version, throttle_time_ms=throttle_ms, error_code=error_code,
              error_message=None, acquisition_lock_timeout_ms=acquisition_lock_timeout_ms,
              responses=[], node_endpoints=[])
    return bytes(msg.encode(version=version))
