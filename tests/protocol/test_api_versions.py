"""ApiVersions: intersecting the broker's answer with the codec, and the proxy's own error body."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from kafka.protocol.metadata.api_versions import ApiVersionsResponse

from kafka_quota_proxy.protocol.api_keys import API_VERSIONS, REFUSED
from kafka_quota_proxy.protocol.api_versions import intersect, unsupported_version_body
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.error_codes import UNSUPPORTED_VERSION
from kafka_quota_proxy.protocol.errors import MalformedMessage, TruncatedMessage
from kafka_quota_proxy.protocol.headers import frame_response, response_body_offset, response_correlation_id

AV = ApiVersionsResponse.ApiVersion

# What a recent broker might advertise: (key, min, max).
BROKER = [
    (0, 0, 12),  # Produce: codec max 13, kept as is
    (1, 4, 20),  # Fetch: capped at the codec's 18
    (3, 0, 13),  # Metadata
    (4, 0, 7),  # LeaderAndIsr: not in the codec
    (10, 0, 6),  # FindCoordinator
    (18, 0, 5),  # ApiVersions: capped at 4
    (60, 0, 2),  # DescribeCluster
    (68, 0, 1),  # ConsumerGroupHeartbeat: from the vendored Kafka specs, kept
    (71, 0, 0),  # GetTelemetrySubscriptions: likewise
    (76, 1, 1),  # ShareGroupHeartbeat: from the vendored specs, kept (KIP-932, charged as Kafka does)
    (78, 1, 2),  # ShareFetch: likewise
    (77, 1, 1),  # ShareGroupDescribe: an admin API, kept
    (75, 1, 3),  # DescribeTopicPartitions: codec max 0 < broker min 1, dropped
    (32, 5, 9),  # DescribeConfigs: codec max 4 < broker min 5, dropped
    (36, 0, 2),  # SaslAuthenticate: equal to the codec
]

# The expected intersection without `served`, sorted by key.
EXPECTED = [(0, 0, 12), (1, 4, 18), (3, 0, 13), (10, 0, 6), (18, 0, 4), (36, 0, 2), (60, 0, 2), (68, 0, 1),
            (71, 0, 0), (76, 1, 1), (77, 1, 1), (78, 1, 2)]

FEATURES: dict[str, Any] = dict(
    supported_features=[ApiVersionsResponse.SupportedFeatureKey(name="metadata.version", min_version=1,
                                                                max_version=21),
                        ApiVersionsResponse.SupportedFeatureKey(name="kraft.version", min_version=0,
                                                                max_version=1)],
    finalized_features_epoch=1234,
    finalized_features=[ApiVersionsResponse.FinalizedFeatureKey(name="metadata.version",
                                                                max_version_level=21, min_version_level=21)],
    zk_migration_ready=True,
)


def response(version: int, entries: list[tuple[int, int, int]], *, error_code: int = 0,
             features: bool = True) -> bytes:
    api_keys = [AV(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in entries]
    msg = ApiVersionsResponse(version=version, error_code=error_code, api_keys=api_keys,
                              throttle_time_ms=321, **(FEATURES if features else {}))
    return bytes(msg.encode(version=version))


def entries(body: bytes, version: int) -> list[tuple[int, int, int]]:
    msg = ApiVersionsResponse.decode(body, version=version)
    return [(e.api_key, e.min_version, e.max_version) for e in msg.api_keys]


def test_broker_list_sanity() -> None:
    table = codec()
    assert 4 not in table  # LeaderAndIsr: gone from Kafka 4, in neither codec
    assert table[68].max_version == 1 and table[71].max_version == 0  # the vendored specs
    assert table[1].max_version == 18
    assert table[18].max_version == 4
    assert table[75].max_version == 0
    assert table[32].max_version == 4


@pytest.mark.parametrize("version", range(5))
def test_intersection(version: int) -> None:
    body = response(version, BROKER)
    out = intersect(memoryview(body), version)
    # Exactly the broker's response with the intersected list: throttle and features kept.
    assert out == response(version, EXPECTED)
    assert entries(out, version) == EXPECTED


def test_a_refused_api_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """REFUSED is empty today; a key put there leaves the answer, and nothing else does."""
    monkeypatch.setitem(REFUSED, 78, "a reason")
    assert entries(intersect(memoryview(response(4, BROKER)), 4), 4) == [e for e in EXPECTED if e[0] != 78]


@pytest.mark.parametrize("version", [3, 4])
def test_tagged_feature_fields_are_kept(version: int) -> None:
    out = intersect(memoryview(response(version, BROKER)), version)
    msg = ApiVersionsResponse.decode(out, version=version)
    assert msg.throttle_time_ms == 321
    assert [(f.name, f.min_version, f.max_version) for f in msg.supported_features] == [
        ("metadata.version", 1, 21), ("kraft.version", 0, 1)]
    assert msg.finalized_features_epoch == 1234
    assert [(f.name, f.min_version_level, f.max_version_level) for f in msg.finalized_features] == [
        ("metadata.version", 21, 21)]
    assert msg.zk_migration_ready is True


@pytest.mark.parametrize("version", [3, 4])
def test_without_feature_tags(version: int) -> None:
    body = response(version, BROKER, features=False)
    assert body[-1] == 0
    assert intersect(memoryview(body), version) == response(version, EXPECTED, features=False)


def test_output_is_sorted_by_key() -> None:
    shuffled = list(reversed(BROKER))
    out = intersect(memoryview(response(3, shuffled)), 3)
    assert entries(out, 3) == EXPECTED


def test_broker_max_below_codec_max_is_kept() -> None:
    out = intersect(memoryview(response(3, [(3, 0, 7), (1, 0, 11)])), 3)
    assert entries(out, 3) == [(1, 0, 11), (3, 0, 7)]


def test_min_equal_to_capped_max_is_kept() -> None:
    # DescribeTopicPartitions 0..3 capped to 0..0; Fetch 18..20 capped to 18..18.
    out = intersect(memoryview(response(3, [(75, 0, 3), (1, 18, 20)])), 3)
    assert entries(out, 3) == [(1, 18, 18), (75, 0, 0)]


@pytest.mark.parametrize("version", range(5))
def test_served_entries_added_only_when_absent(version: int) -> None:
    served = [(48, 0, 1), (3, 0, 99), (49, 0, 1), (72, 0, 0)]
    out = intersect(memoryview(response(version, BROKER)), version, served)
    expected = sorted(EXPECTED + [(48, 0, 1), (49, 0, 1), (72, 0, 0)])
    # Metadata stays as the broker/codec intersection: the served range does not replace it.
    assert entries(out, version) == expected
    assert out == response(version, expected)


def test_served_entry_added_when_the_broker_entry_was_dropped() -> None:
    # The broker's DescribeConfigs 5..9 cannot be served by the codec; the proxy serves its own.
    out = intersect(memoryview(response(3, [(32, 5, 9)])), 3, [(32, 0, 4)])
    assert entries(out, 3) == [(32, 0, 4)]


def test_empty_broker_list() -> None:
    out = intersect(memoryview(response(3, [])), 3)
    assert out == response(3, [])
    assert intersect(memoryview(response(3, [])), 3, [(48, 0, 1)]) == response(3, [(48, 0, 1)])


def v0_error_body(entries_: list[tuple[int, int, int]]) -> bytes:
    """UNSUPPORTED_VERSION as a broker sends it: always a v0 body, whatever was asked."""
    return (struct.pack(">h", UNSUPPORTED_VERSION) + struct.pack(">i", len(entries_))
            + b"".join(struct.pack(">hhh", *e) for e in entries_))


@pytest.mark.parametrize("requested", range(5))
def test_broker_unsupported_version_is_handled_as_v0(requested: int) -> None:
    body = v0_error_body([(18, 0, 3)])
    out = intersect(memoryview(body), requested)
    assert out == body  # nothing to drop or cap; still v0
    msg = ApiVersionsResponse.decode(out, version=0)
    assert msg.error_code == UNSUPPORTED_VERSION
    assert [(e.api_key, e.min_version, e.max_version) for e in msg.api_keys] == [(18, 0, 3)]


def test_broker_unsupported_version_range_is_capped() -> None:
    out = intersect(memoryview(v0_error_body([(18, 0, 7)])), 4)
    assert out == v0_error_body([(18, 0, 4)])


@pytest.mark.parametrize("version", [3, 4])
def test_other_broker_errors_are_forwarded_untouched(version: int) -> None:
    # e.g. INVALID_REQUEST (42) for a bad client software name: sent at the request's version.
    body = response(version, [], error_code=42, features=False)
    assert intersect(memoryview(body), version) == body
    body = response(version, [(3, 0, 13)], error_code=42)
    assert intersect(memoryview(body), version, [(48, 0, 1)]) == body


def test_truncated_and_malformed_bodies() -> None:
    for body in (b"", b"\x00"):
        with pytest.raises(TruncatedMessage):
            intersect(memoryview(body), 3)
    with pytest.raises(TruncatedMessage):
        intersect(memoryview(b"\x00\x00\x05"), 3)  # four entries promised, none there
    whole = response(2, BROKER)
    with pytest.raises(TruncatedMessage):
        intersect(memoryview(whole[:-5]), 2)
    with pytest.raises(MalformedMessage):
        intersect(memoryview(whole + b"\x00"), 2)
    with pytest.raises(MalformedMessage):
        intersect(memoryview(b"\x00\x00\x00\x00\x00\x00\x00\x00"), 3)  # a null api_keys


def test_unsupported_version_body_exact_bytes() -> None:
    body = unsupported_version_body()
    top = codec()[API_VERSIONS].max_version
    assert top == 4
    assert body == b"\x00\x23" + b"\x00\x00\x00\x01" + b"\x00\x12\x00\x00\x00\x04"


def test_unsupported_version_body_decodes_as_v0() -> None:
    msg = ApiVersionsResponse.decode(unsupported_version_body(), version=0)
    assert msg.error_code == 35
    assert [(e.api_key, e.min_version, e.max_version) for e in msg.api_keys] == [(18, 0, 4)]


def test_unsupported_version_body_in_a_v0_frame() -> None:
    header_version = codec()[API_VERSIONS].response_header_version(5)
    assert header_version == 0
    frame = frame_response(31, header_version, unsupported_version_body())
    assert response_correlation_id(frame) == 31
    assert frame[response_body_offset(frame, 0) :] == unsupported_version_body()
    decoded = ApiVersionsResponse.decode(frame, version=0, header=True, framed=True)
    assert decoded.header.correlation_id == 31
    assert decoded.error_code == 35
