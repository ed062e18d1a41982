"""throttle_time_ms found and patched in every response that carries it, and the Fetch pieces the
quota stages rely on: reading a Fetch request's quota fields and Kafka's throttled Fetch response.

Responses are built with kafka-python's classes (generated from Kafka's message JSON). The
expected offset of throttle_time_ms is found independently of the schema walker: two encodings
that differ only in that field differ in exactly its four bytes.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.fetch import read_fetch_request, session_id, throttled_response_body
from kafka_quota_proxy.protocol.throttle import carries_throttle, patched, read_throttle, throttle_offset
from tests.support.encoding import compact_string

OLD = 0x01020304
NEW = 0x7E0D0C0B  # every byte differs from OLD's


def _has_field(api_key: int, version: int) -> bool:
    """kafka-python's own view of the schema: is throttle_time_ms in this version?"""
    fields = codec()[api_key].response._struct.fields
    return "throttle_time_ms" in fields and fields["throttle_time_ms"].for_version_q(version)


ALL = [(key, v) for key, spec in sorted(codec().items()) for v in range(spec.max_version + 1)]
WITH = [(key, v) for key, v in ALL if _has_field(key, v)]
WITHOUT = [(key, v) for key, v in ALL if not _has_field(key, v)]


def _content(api_key: int, version: int) -> dict[str, Any]:
    """Non-empty content ahead of the field where it is not first (Produce, ApiVersions,
    OffsetDelete); schema defaults everywhere else."""
    cls: Any = codec()[api_key].response
    if api_key == 0:
        part = cls.TopicProduceResponse.PartitionProduceResponse
        extra: dict[str, Any] = {}
        if version >= 8:
            extra["record_errors"] = [part.BatchIndexAndErrorMessage(batch_index=2,
                                                                     batch_index_error_message="bad")]
            extra["error_message"] = "not leader"
        parts = [part(index=i, error_code=6 * i, base_offset=100 + i, log_append_time_ms=-1,
                      log_start_offset=7, **extra) for i in range(2)]
        ident = {"topic_id": uuid.UUID(int=0xABC)} if version >= 13 else {"name": "orders"}
        return {"responses": [cls.TopicProduceResponse(**ident, partition_responses=parts)]}
    if api_key == 18:
        content: dict[str, Any] = {"api_keys": [cls.ApiVersion(api_key=k, min_version=0, max_version=m)
                                                for k, m in ((0, 11), (1, 17), (18, 4))]}
        if version >= 3:
            content["supported_features"] = [cls.SupportedFeatureKey(name="metadata.version",
                                                                     min_version=1, max_version=20)]
            content["finalized_features_epoch"] = 42
        return content
    if api_key == 47:
        topic = cls.OffsetDeleteResponseTopic
        return {"error_code": 0, "topics": [topic(name="orders", partitions=[
            topic.OffsetDeleteResponsePartition(partition_index=i, error_code=0) for i in range(3)])]}
    return {}


def _encode(api_key: int, version: int, throttle_ms: int) -> bytes:
    cls: Any = codec()[api_key].response
    msg = cls(version=version, throttle_time_ms=throttle_ms, **_content(api_key, version))
    return bytes(msg.encode(version=version))


def _decode(api_key: int, version: int, body: bytes) -> dict[str, Any]:
    return dict(codec()[api_key].response.decode(body, version=version).to_dict())


def test_every_response_with_the_field_is_covered() -> None:
    keys = {key for key, _ in WITH}
    assert {0, 1, 3, 18, 47, 48, 49}.issubset(keys)
    assert len(WITH) >= 224  # kafka-python 3.0.12: every version of every response with the field
    assert {(key, v) for key, v in ALL if carries_throttle(key, v)} == set(WITH)


@pytest.mark.parametrize(("api_key", "version"), WITH)
def test_throttle_offset_points_at_the_field(api_key: int, version: int) -> None:
    old, new = _encode(api_key, version, OLD), _encode(api_key, version, NEW)
    assert len(old) == len(new)
    differ = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
    expected_at = differ[0]
    assert differ == [expected_at, expected_at + 1, expected_at + 2, expected_at + 3]

    body = memoryview(old)
    at = throttle_offset(api_key, version, body)
    assert at == expected_at
    assert read_throttle(body, at) == OLD
    assert carries_throttle(api_key, version)

    out = patched(body, at, NEW).join()
    assert out == new
    before, after = _decode(api_key, version, old), _decode(api_key, version, out)
    assert (before.pop("throttle_time_ms"), after.pop("throttle_time_ms")) == (OLD, NEW)
    assert after == before


@pytest.mark.parametrize(("api_key", "version"), WITHOUT)
def test_versions_without_the_field(api_key: int, version: int) -> None:
    assert not carries_throttle(api_key, version)
    cls: Any = codec()[api_key].response
    body = memoryview(bytes(cls(version=version).encode(version=version)))
    assert throttle_offset(api_key, version, body) is None


def test_unknown_api_key_carries_no_field() -> None:
    assert not carries_throttle(9999, 0)
    assert throttle_offset(9999, 0, memoryview(b"\x00" * 8)) is None


# --- Fetch requests ------------------------------------------------------------------------------

FETCH_VERSIONS = list(range(codec()[1].max_version + 1))


def _fetch_request(version: int, *, replica_id: int, max_wait_ms: int, max_bytes: int,
                   cluster_id: str | None = None) -> bytes:
    kw: dict[str, Any] = {}
    if version >= 15:
        if replica_id >= 0:
            kw["replica_state"] = FetchRequest.ReplicaState(replica_id=replica_id, replica_epoch=7)
    else:
        kw["replica_id"] = replica_id
    if cluster_id is not None and version >= 12:
        kw["cluster_id"] = cluster_id
    topic = FetchRequest.FetchTopic
    part = topic.FetchPartition
    topics = [topic(topic="orders", topic_id=uuid.UUID(int=5), partitions=[
        part(partition=p, fetch_offset=1000 + p, partition_max_bytes=1048576) for p in range(2)])]
    msg = FetchRequest(version=version, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
                       isolation_level=1, session_id=0, session_epoch=-1, topics=topics,
                       forgotten_topics_data=[], rack_id="r1", **kw)
    return bytes(msg.encode(version=version))


def _frame(version: int, body: bytes) -> bytes:
    """A whole request frame: size, header (v1, or v2 from Fetch v12), body."""
    header = struct.pack(">hhih", 1, version, 77, 8) + b"consumer"
    if version >= 12:
        header += b"\x00"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@pytest.mark.parametrize("replica_id", [-1, 0, 3])
def test_read_fetch_request(version: int, replica_id: int) -> None:
    body = _fetch_request(version, replica_id=replica_id, max_wait_ms=500, max_bytes=123456,
                          cluster_id="cluster-A")
    frame = _frame(version, body)
    body_offset = len(frame) - len(body)
    info = read_fetch_request(memoryview(frame), body_offset, version)
    assert info.replica_id == replica_id
    assert info.max_wait_ms == 500
    if version < 3:
        assert (info.max_bytes_at, info.max_bytes) == (None, None)
        return
    assert info.max_bytes == 123456
    # Independently: the bytes that change with max_bytes are max_bytes.
    other = _fetch_request(version, replica_id=replica_id, max_wait_ms=500, max_bytes=0x7E0D0C0B,
                           cluster_id="cluster-A")
    differ = [i for i, (a, b) in enumerate(zip(body, other, strict=True)) if a != b]
    assert info.max_bytes_at == body_offset + differ[0]
    assert differ == [differ[0] + i for i in range(4)]
    assert struct.unpack_from(">i", frame, info.max_bytes_at)[0] == 123456


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_read_fetch_request_refuses_a_body_cut_short(version: int) -> None:
    """Up to v14 only the leading fields are read (at fixed offsets), and v15+ walks the body:
    either way a body that ends before what is read is the client's protocol error."""
    body = _fetch_request(version, replica_id=-1, max_wait_ms=500, max_bytes=123456)
    cut = 15 if 3 <= version < 15 else 7 if version < 3 else len(body) - 1
    frame = _frame(version, body[:cut])
    with pytest.raises(ProtocolError):
        read_fetch_request(memoryview(frame), len(frame) - cut, version)


@pytest.mark.parametrize("version", [v for v in FETCH_VERSIONS if v >= 15])
def test_replica_state_tag_among_other_tags(version: int) -> None:
    # ClusterId (tag 0) before ReplicaState (tag 1): the replica id is still found.
    body = _fetch_request(version, replica_id=4, max_wait_ms=0, max_bytes=10, cluster_id="c")
    info = read_fetch_request(memoryview(_frame(version, body)), len(_frame(version, body)) - len(body),
                              version)
    assert (info.replica_id, info.max_wait_ms, info.max_bytes) == (4, 0, 10)
    # A consumer on v15+ sends no ReplicaState at all: replica id -1.
    plain = _fetch_request(version, replica_id=-1, max_wait_ms=0, max_bytes=10)
    frame = _frame(version, plain)
    assert read_fetch_request(memoryview(frame), len(frame) - len(plain), version).replica_id == -1


def test_replica_state_tag_bytes_are_as_kafka_writes_them() -> None:
    # v15 body tail: tagged fields [tag 0: cluster id "c"], [tag 1: replica id 4, epoch 7].
    body = _fetch_request(15, replica_id=4, max_wait_ms=0, max_bytes=10, cluster_id="c")
    cluster = compact_string("c")
    state = struct.pack(">iq", 4, 7) + b"\x00"
    tail = b"\x02" + b"\x00" + bytes([len(cluster)]) + cluster + b"\x01" + bytes([len(state)]) + state
    assert body.endswith(tail)


# --- Kafka's throttled Fetch response ------------------------------------------------------------

def _fetch_response(version: int, throttle_ms: int, session: int) -> bytes:
    topic = FetchResponse.FetchableTopicResponse
    part = topic.PartitionData
    msg = FetchResponse(version=version, throttle_time_ms=throttle_ms, error_code=0, session_id=session,
                        responses=[topic(topic="orders", topic_id=uuid.UUID(int=5), partitions=[
                            part(partition_index=0, error_code=0, high_watermark=10,
                                 last_stable_offset=10, log_start_offset=0, aborted_transactions=None,
                                 preferred_read_replica=-1, records=b"r" * 64)])])
    return bytes(msg.encode(version=version))


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_session_id_of_a_fetch_response(version: int) -> None:
    body = memoryview(_fetch_response(version, 5, 0x0A0B0C0D))
    assert session_id(body, version) == (0x0A0B0C0D if version >= 7 else 0)


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_throttled_response_body_is_an_empty_response(version: int) -> None:
    body = throttled_response_body(version, 2000, 0x0A0B0C0D)
    msg = FetchResponse.decode(body, version=version)
    assert msg.responses == []
    if version >= 1:
        assert msg.throttle_time_ms == 2000
    if version >= 7:
        assert (msg.error_code, msg.session_id) == (0, 0x0A0B0C0D)
    # Exactly the bytes kafka-python writes for that empty response, nothing more.
    expected = FetchResponse(version=version, throttle_time_ms=2000, error_code=0,
                             session_id=0x0A0B0C0D, responses=[])
    assert body == bytes(expected.encode(version=version))
