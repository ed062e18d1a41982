"""ThrottleMerge (proxy/stages/throttle_merge.py), called directly: it wants a response only when
the proxy throttles the request; a response whose throttle_time_ms is below the proxy's is
patched to it, at the field's place (first in ListGroups, after the topics in Produce), whole or
streamed (on_head); one at or above it, or of a version without the field, is left alone."""

from __future__ import annotations

import struct

from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.stages.throttle_merge import ThrottleMerge
from tests.proxy.conftest import request_frame
from tests.proxy.quota_support import list_groups_response, produce_response

PRODUCE, LIST_GROUPS = 0, 16


def context(api_key: int, version: int, throttle_ms: int) -> RequestContext:
    frame = memoryview(request_frame(api_key, version, 7))
    ctx = RequestContext(parse_request_header(frame), frame, ConnectionInfo("127.0.0.1:5000", "bootstrap"))
    ctx.throttle_for(throttle_ms)
    return ctx


def list_groups_v1(throttle_ms: int) -> bytes:
    # throttle_time_ms, error_code, an empty groups array: written out, not by the code under test
    return struct.pack(">ihi", throttle_ms, 0, 0)


def test_only_a_throttled_request_wants_its_response() -> None:
    stage = ThrottleMerge()
    assert stage.wants(context(LIST_GROUPS, 1, 0)) is False
    assert stage.wants(context(LIST_GROUPS, 1, 1)) is True
    assert stage.streams is True and stage.api_keys is None  # every API, cut-through allowed


def test_a_broker_throttle_below_the_proxys_is_raised_to_it() -> None:
    ctx = context(LIST_GROUPS, 1, 250)
    assert list_groups_v1(0) == list_groups_response(1)  # the layout written out is Kafka's
    new = ThrottleMerge().on_response(ctx, memoryview(list_groups_v1(40)))
    assert isinstance(new, Pieces)  # the rest of the body is not copied
    assert new.join() == list_groups_v1(250)


def test_a_broker_throttle_at_or_above_the_proxys_is_left_alone() -> None:
    stage = ThrottleMerge()
    ctx = context(LIST_GROUPS, 1, 250)
    assert stage.on_response(ctx, memoryview(list_groups_v1(250))) is None
    assert stage.on_response(ctx, memoryview(list_groups_v1(900))) is None
    assert stage.on_head(ctx, memoryview(list_groups_v1(900)), 10) is None


def test_a_version_without_the_field_is_left_alone() -> None:
    ctx = context(LIST_GROUPS, 0, 250)
    body = struct.pack(">hi", 0, 0)  # ListGroups v0: error_code, groups; no throttle_time_ms
    assert ThrottleMerge().on_response(ctx, memoryview(body)) is None


def test_produce_is_patched_where_its_throttle_sits_after_the_topics() -> None:
    ctx = context(PRODUCE, 7, 300)
    body = produce_response(7, 20)
    at = len(body) - 4  # Produce v7: responses, then throttle_time_ms last
    assert body[at:] == struct.pack(">i", 20)
    new = ThrottleMerge().on_response(ctx, memoryview(body))
    assert isinstance(new, Pieces)
    assert new.join() == produce_response(7, 300)
    assert ThrottleMerge().on_response(ctx, memoryview(produce_response(7, 301))) is None


def test_a_streamed_head_is_patched_to_the_same_length() -> None:
    ctx = context(LIST_GROUPS, 1, 250)
    head = list_groups_v1(3)
    assert ThrottleMerge().on_head(ctx, memoryview(head), 100) == list_groups_v1(250)
