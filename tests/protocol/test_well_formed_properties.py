"""Properties of the request body check (protocol/well_formed.py), at every API and version the
codec knows: every request kafka-python encodes passes; damaged and arbitrary bodies raise only
ProtocolError; and a body that passes has true lengths, so kafka-python, which reads every length
it meets, decodes it without running out of bytes."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.api_keys import REFUSED
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from kafka_quota_proxy.protocol.well_formed import check_request
from tests.support.frames import FUZZ_CREATE_TOPICS
from tests.support.messages import has_nullable_struct, message
from tests.support.mutations import mutated

# Every key the codec frames but those the proxy refuses (parse_request_header refuses them).
api_versions = st.sampled_from(sorted(set(codec()) - set(REFUSED))).flatmap(
    lambda key: st.tuples(st.just(key), st.integers(0, codec()[key].max_version)))


@st.composite
def valid_requests(draw: st.DrawFn) -> bytes:
    key, version = draw(api_versions)
    msg = draw(message(codec()[key].request, version))
    return frame_request(msg, version, draw(st.integers(0, 2**31 - 1)), draw(st.none() | st.text(max_size=8)))


def check(frame: bytes) -> None:
    view = memoryview(frame)
    check_request(view, parse_request_header(view))


@given(valid_requests())
def test_every_request_kafka_python_encodes_passes(frame: bytes) -> None:
    check(frame)


@given(valid_requests().flatmap(mutated))
def test_damaged_requests_raise_only_protocol_errors(frame: bytes) -> None:
    try:
        check(frame)
    except ProtocolError:
        pass


@given(api_versions, st.binary(max_size=200))
def test_arbitrary_bodies_raise_only_protocol_errors(api: tuple[int, int], body: bytes) -> None:
    key, version = api
    header = struct.pack(">hhih", key, version, 1, -1)
    if codec()[key].is_flexible(version):
        header += b"\x00"  # no header tags
    try:
        check(struct.pack(">i", len(header) + len(body)) + header + body)
    except ProtocolError:
        pass


def _decodes(frame: bytes) -> Any:
    view = memoryview(frame)
    header = parse_request_header(view)
    assert header.spec is not None
    return header.spec.request.decode(frame[header.body_offset:], version=header.api_version)


# The input the whole-proxy fuzz killed Tansu with (docs/reliability.md): CreateTopics v7 with
# null Assignments and Configs; refused for those nulls. Its well-formed twin is CreateTopicsLimit's.
@example(FUZZ_CREATE_TOPICS)
@given(valid_requests().flatmap(mutated))
def test_a_body_that_passes_has_every_length_true(frame: bytes) -> None:
    # kafka-python reads each length it meets and fails (struct.error, IndexError, ...) where
    # one runs past the end; a body that passes must not make it. It may still refuse what is
    # not this check's to judge: text that is not UTF-8, a bool byte other than 0 or 1. And it
    # reads a nullable struct's marker as null only when it is -1, Kafka when it is negative, so
    # it may run past the end of bytes Kafka reads (the well_formed fuzz target found one).
    try:
        check(frame)
    except ProtocolError:
        return
    header = parse_request_header(memoryview(frame))
    assert header.spec is not None
    try:
        _decodes(frame)
    except (UnicodeDecodeError, ValueError):
        pass
    except (IndexError, struct.error):
        if not has_nullable_struct(header.spec.request, header.api_version):
            raise
