"""A request's throttle (proxy/context.py): set in one place, the longest of its quotas' holds."""

from __future__ import annotations

import dataclasses

from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from tests.proxy.conftest import request_frame


def test_the_longest_throttle_holds_whatever_the_order() -> None:
    frame = memoryview(request_frame(3, 0, 7))
    ctx = RequestContext(parse_request_header(frame), frame, ConnectionInfo("127.0.0.1:5000", "bootstrap"))
    ctx.throttle_for(0)
    assert ctx.throttle_ms == 0
    ctx.throttle_for(250)  # the client's quota
    ctx.throttle_for(100)  # a topic's, shorter: the client is still muted 250 ms
    assert ctx.throttle_ms == 250
    ctx.throttle_for(400)
    assert ctx.throttle_ms == 400


def test_the_context_holds_what_every_stage_shares_and_no_more() -> None:
    # What one stage hands another is a typed part (Times, Rewrite, Charged, Topics) saying who
    # writes and who reads it (issue 38: at most 12 fields).
    assert [f.name for f in dataclasses.fields(RequestContext)] == [
        "header", "frame", "conn", "acks", "times", "rewrite", "charged", "throttle_ms",
        "fetch_max_wait_ms", "raw", "topics", "hold"]
