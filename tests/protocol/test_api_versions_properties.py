"""Properties of ApiVersions handling and of the proxy's own bootstrap requests: the answer to a
client is exactly the intersection of the broker's versions and the codec's plus what the proxy
serves, every other field as the broker sent it; the broker's bytes, damaged or arbitrary, raise
only ProtocolError."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from kafka.protocol.metadata.api_versions import ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataResponse

from kafka_quota_proxy.protocol.api_keys import ALTER_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS, METADATA, REFUSED
from kafka_quota_proxy.protocol.api_versions import intersect, unsupported_version_body
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.bootstrap import metadata_brokers, metadata_version
from kafka_quota_proxy.protocol.error_codes import UNSUPPORTED_VERSION
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import frame_response
from tests.support.future import encode_future, future
from tests.support.messages import message
from tests.support.mutations import mutated

A = ApiVersionsResponse.ApiVersion
VERSIONS = st.integers(0, ApiVersionsResponse.max_version)
SERVED = [(DESCRIBE_CLIENT_QUOTAS, 0, 1), (ALTER_CLIENT_QUOTAS, 0, 1)]
# Keys around the codec's: known ones, unknown ones, refused ones and the quota APIs the proxy serves.
entries = st.lists(st.builds(A, api_key=st.integers(0, 100) | st.sampled_from(sorted(codec())),
                             min_version=st.integers(0, 20), max_version=st.integers(0, 20)), max_size=12)
broker_answers = VERSIONS.flatmap(lambda v: st.tuples(
    st.just(v), message(ApiVersionsResponse, v), entries, st.lists(st.sampled_from(SERVED), unique=True)))


def expected_entries(broker: list[Any], served: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The intersection, computed here without the code under test's loop: the keys refused on
    purpose are dropped as the unknown ones are."""
    table = codec()
    kept = [(e.api_key, e.min_version, min(e.max_version, table[e.api_key].max_version))
            for e in broker if e.api_key in table and e.api_key not in REFUSED]
    kept = [k for k in kept if k[1] <= k[2]]
    present = {k[0] for k in kept}
    kept += [s for s in served if s[0] not in present]
    return sorted(kept, key=lambda k: k[0])


@given(broker_answers)
def test_intersection_exact_and_other_fields_kept(case: tuple[int, Any, list[Any], list[Any]]) -> None:
    version, msg, broker_entries, served = case
    msg.error_code, msg.api_keys = 0, broker_entries
    body = bytes(msg.encode(version=version))
    out = ApiVersionsResponse.decode(intersect(memoryview(body), version, served), version=version)
    assert [(e.api_key, e.min_version, e.max_version) for e in out.api_keys] == expected_entries(
        broker_entries, served)
    original = ApiVersionsResponse.decode(body, version=version)
    original.api_keys = out.api_keys
    assert out == original


@given(VERSIONS, entries)
def test_unsupported_version_answer_is_read_as_v0(version: int, broker_entries: list[Any]) -> None:
    # KIP-511: a broker that does not know the request's version answers in v0, whatever was asked.
    body = bytes(ApiVersionsResponse(version=0, error_code=UNSUPPORTED_VERSION,
                                     api_keys=broker_entries).encode(version=0))
    out = ApiVersionsResponse.decode(intersect(memoryview(body), version), version=0)
    assert out.error_code == UNSUPPORTED_VERSION
    assert [(e.api_key, e.min_version, e.max_version) for e in out.api_keys] == expected_entries(
        broker_entries, [])


@given(VERSIONS, st.integers(-(2**15), 2**15 - 1).filter(lambda c: c not in (0, UNSUPPORTED_VERSION)),
       st.binary(max_size=20))
def test_other_errors_pass_unchanged(version: int, error: int, rest: bytes) -> None:
    body = error.to_bytes(2, "big", signed=True) + rest
    assert intersect(memoryview(body), version) == body


def test_unsupported_version_body_is_v0_with_api_versions() -> None:
    msg = ApiVersionsResponse.decode(unsupported_version_body(), version=0)
    assert msg.error_code == UNSUPPORTED_VERSION
    assert [(e.api_key, e.min_version) for e in msg.api_keys] == [(18, 0)]


@st.composite
def damaged(draw: st.DrawFn) -> tuple[int, bytes]:
    version, msg, broker_entries, _ = draw(broker_answers)
    msg.error_code, msg.api_keys = draw(st.sampled_from([0, UNSUPPORTED_VERSION])), broker_entries
    return version, draw(mutated(bytes(msg.encode(version=version))))


@given(damaged() | st.tuples(VERSIONS, st.binary(max_size=60)))
@example((3, b"\x00\x00\x00\x00\x00\x00\x00\x00"))  # api_keys null (compact 0): leaked TypeError
@example((0, b"\x00\x00\xff\xff\xff\xff"))  # api_keys null (length -1) in v0
def test_broker_bytes_raise_only_protocol_errors(case: tuple[int, bytes]) -> None:
    version, body = case
    try:
        intersect(memoryview(body), version, SERVED)
    except ProtocolError:
        pass


# --- bootstrap: the proxy's own ApiVersions v0 and Metadata ------------------------------------

CORR = 7


@given(entries)
def test_bootstrap_metadata_version(broker_entries: list[Any]) -> None:
    body = bytes(ApiVersionsResponse(version=0, error_code=0, api_keys=broker_entries).encode(version=0))
    frame = frame_response(CORR, 0, body)
    usable = [min(e.max_version, codec()[METADATA].max_version) for e in broker_entries
              if e.api_key == METADATA]
    first = next(((e, v) for e, v in zip([e for e in broker_entries if e.api_key == METADATA], usable,
                                         strict=True) if v >= max(e.min_version, 1)), None)
    try:
        got = metadata_version(frame, CORR)
    except ProtocolError:
        assert first is None
    else:
        assert first is not None and got == first[1]


metadata_answers = st.integers(1, MetadataResponse.max_version).flatmap(
    lambda v: st.tuples(st.just(v), message(MetadataResponse, v)))


@given(metadata_answers)
def test_bootstrap_metadata_brokers(case: tuple[int, Any]) -> None:
    version, msg = case
    frame = frame_response(CORR, codec()[METADATA].response_header_version(version),
                           bytes(msg.encode(version=version)))
    assert metadata_brokers(frame, CORR, version) == [(b.node_id, b.host, b.port) for b in msg.brokers]


NULL_ARRAY = frame_response(CORR, 0, b"\x00\x00\xff\xff\xff\xff")  # ApiVersions v0, api_keys null
NULL_BROKERS = frame_response(CORR, 0, b"\xff\xff\xff\xff")  # Metadata v1/v2: brokers null


@given(st.binary(max_size=60), st.integers(1, MetadataResponse.max_version))
@example(NULL_ARRAY, 1)  # leaked TypeError from metadata_version
@example(NULL_BROKERS, 1)  # leaked TypeError from metadata_brokers
def test_bootstrap_arbitrary_bytes_raise_only_protocol_errors(frame: bytes, version: int) -> None:
    for call in (lambda: metadata_version(frame, CORR), lambda: metadata_brokers(frame, CORR, version)):
        try:
            call()
        except ProtocolError:
            pass


FutureResponse = future(ApiVersionsResponse)
future_entries = st.lists(st.fixed_dictionaries(
    {"api_key": st.integers(0, 100) | st.sampled_from(sorted(codec())),
     "min_version": st.integers(0, 20), "max_version": st.integers(0, 20)},
    optional={"future63": st.binary(max_size=3), "future200": st.binary(max_size=140)},
).map(lambda kw: FutureResponse.ApiVersion(**kw)), max_size=12)


@given(VERSIONS.flatmap(lambda v: st.tuples(
    st.just(v), message(FutureResponse, v), future_entries, st.lists(st.sampled_from(SERVED), unique=True))))
def test_unknown_tagged_fields_survive_byte_for_byte(case: tuple[int, Any, list[Any], list[Any]]) -> None:
    """A newer broker's tagged fields, at the top and in each entry, are kept: the output is what
    kafka-python writes for the same message with the intersected entries (a kept entry with its
    tags, capped; a served one new)."""
    version, msg, broker_entries, served = case
    msg.error_code, msg.api_keys = 0, broker_entries
    body = encode_future(msg, version)
    out = intersect(memoryview(body), version, served)
    expected = expected_entries(broker_entries, served)
    kept = []
    table = codec()
    for e in broker_entries:
        if e.api_key in table and e.api_key not in REFUSED:
            e.max_version = min(e.max_version, table[e.api_key].max_version)
            if e.min_version <= e.max_version:
                kept.append(e)
    present = {e.api_key for e in kept}
    kept += [FutureResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
             for k, lo, hi in served if k not in present]
    msg.api_keys = sorted(kept, key=lambda e: e.api_key)
    assert [(e.api_key, e.min_version, e.max_version) for e in msg.api_keys] == expected
    assert out == encode_future(msg, version)
