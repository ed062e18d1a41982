"""WellFormed (proxy/stages/well_formed.py), called directly: a request whose body parses by its
schema passes (None), whatever API and version; one cut short raises TruncatedMessage naming the
field it ran out in, one with a null where the schema allows none raises MalformedMessage; an
ApiVersions newer than the codec, which ApiVersionsGate answers, is not checked."""

from __future__ import annotations

import struct

import pytest

from kafka_quota_proxy.protocol.errors import MalformedMessage, ProtocolError, TruncatedMessage
from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.stages.well_formed import WellFormed
from tests.proxy.conftest import request_frame
from tests.proxy.quota_support import fetch, produce
from tests.support.frames import FUZZ_CREATE_TOPICS, LIBRDKAFKA_METADATA


def context(frame: bytes) -> RequestContext:
    view = memoryview(frame)
    return RequestContext(parse_request_header(view), view, ConnectionInfo("127.0.0.1:5000", "bootstrap"))


def cut(frame: bytes, n: int) -> bytes:
    """The frame less its last `n` bytes, its size prefix saying so."""
    short = frame[: len(frame) - n]
    return struct.pack(">i", len(short) - 4) + short[4:]


@pytest.mark.parametrize("version", [3, 9, 13])
def test_a_whole_produce_passes(version: int) -> None:
    assert WellFormed().on_request(context(frame_request(produce(version), version, 7, "c"))) is None


def test_a_whole_fetch_and_librdkafkas_metadata_with_trailing_bytes_pass() -> None:
    assert WellFormed().on_request(context(frame_request(fetch(12), 12, 7, "c"))) is None
    assert WellFormed().on_request(context(LIBRDKAFKA_METADATA)) is None
    assert WellFormed().api_keys is None  # every request is checked


def test_a_produce_cut_in_its_records_is_truncated() -> None:
    whole = frame_request(produce(3), 3, 7, "c")  # one partition of 100 record bytes, last in the body
    with pytest.raises(ProtocolError) as raised:
        WellFormed().on_request(context(cut(whole, 10)))
    assert raised.type is TruncatedMessage
    assert str(raised.value) == ("Produce v3: TopicData[].PartitionData[].Records: "
                                 "runs past the end (90 bytes were left)")


def test_an_array_count_beyond_the_bytes_is_truncated() -> None:
    frame = request_frame(0, 3, 7, struct.pack(">hhii", -1, 1, 1000, 0x7FFFFFFF))
    with pytest.raises(ProtocolError) as raised:
        WellFormed().on_request(context(frame))
    assert raised.type is TruncatedMessage
    assert str(raised.value) == "Produce v3: TopicData: an array of 2147483647, 0 bytes left"


def test_a_null_where_none_is_allowed_is_malformed() -> None:
    with pytest.raises(ProtocolError) as raised:
        WellFormed().on_request(context(FUZZ_CREATE_TOPICS))
    assert raised.type is MalformedMessage
    assert str(raised.value) == "CreateTopics v7: Topics[].Assignments: null in a field that is not nullable"


def test_an_api_versions_newer_than_the_codec_is_left_to_the_gate() -> None:
    ctx = context(request_frame(18, 99, 7, b"\xff\xff", flexible=True))
    assert ctx.header.spec is None
    assert WellFormed().on_request(ctx) is None
