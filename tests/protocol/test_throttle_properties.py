"""Properties of the throttle_time_ms patcher, for every API and version whose response carries
the field: it is found where kafka-python wrote it, the patched body holds the new value and
every other byte as it was; damaged or arbitrary bodies raise only ProtocolError."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.api_keys import API_VERSIONS
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.throttle import carries_throttle, patched, read_throttle, throttle_offset
from tests.support.messages import message
from tests.support.mutations import mutated

CARRYING = [(key, v) for key, spec in sorted(codec().items()) for v in range(spec.max_version + 1)
            if carries_throttle(key, v)]
ALL = [(key, v) for key, spec in sorted(codec().items()) for v in range(spec.max_version + 1)]
THROTTLE = st.integers(0, 2**31 - 1)


def _response(api: tuple[int, int]) -> st.SearchStrategy[tuple[int, int, Any]]:
    key, version = api
    msgs = message(codec()[key].response, version)
    if key == API_VERSIONS:
        # kafka-python reads an ApiVersions error body as v0 (KIP-511), so it cannot round-trip.
        msgs = msgs.filter(lambda m: m.error_code == 0)
    return msgs.map(lambda m: (key, version, m))


responses = st.sampled_from(CARRYING).flatmap(_response)


def test_the_field_is_carried_somewhere() -> None:
    # Guards the sampling: most APIs carry the field, and not at version 0 of ApiVersions.
    assert len(CARRYING) > 200 and (API_VERSIONS, 0) not in CARRYING and (API_VERSIONS, 1) in CARRYING


@given(responses, THROTTLE)
def test_found_read_and_patched_exactly(case: tuple[int, int, Any], new_ms: int) -> None:
    key, version, msg = case
    cls = codec()[key].response
    body = bytes(msg.encode(version=version))
    at = throttle_offset(key, version, memoryview(body))
    assert at is not None
    assert read_throttle(memoryview(body), at) == msg.throttle_time_ms
    new = patched(memoryview(body), at, new_ms).join()
    assert len(new) == len(body)
    assert new[:at] == body[:at] and new[at + 4:] == body[at + 4:]
    assert read_throttle(memoryview(new), at) == new_ms
    msg.throttle_time_ms = new_ms
    assert cls.decode(new, version=version) == msg


@given(st.sampled_from(ALL), st.binary(max_size=64))
def test_arbitrary_bodies_raise_only_protocol_errors(api: tuple[int, int], body: bytes) -> None:
    key, version = api
    try:
        at = throttle_offset(key, version, memoryview(body))
    except ProtocolError:
        return
    if at is not None:
        assert 0 <= at <= len(body) - 4
        read_throttle(memoryview(body), at)


@st.composite
def damaged(draw: st.DrawFn) -> tuple[int, int, bytes]:
    key, version, msg = draw(responses)
    return key, version, draw(mutated(bytes(msg.encode(version=version))))


@given(damaged())
def test_damaged_bodies_raise_only_protocol_errors(case: tuple[int, int, bytes]) -> None:
    key, version, body = case
    try:
        at = throttle_offset(key, version, memoryview(body))
    except ProtocolError:
        return
    assert at is not None and 0 <= at <= len(body) - 4
