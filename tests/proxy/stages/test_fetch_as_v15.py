"""stages/fetch_as_v15.py: Fetch v16 and v17 go to the broker as v15, their header's version bytes
patched and the response expected in v15; every other version passes untouched."""

from __future__ import annotations

import struct

import pytest

from kafka_quota_proxy.protocol.api_keys import FETCH
from kafka_quota_proxy.protocol.headers import API_VERSION_AT, parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.stages.fetch_as_v15 import FetchAsV15
from tests.proxy.conftest import request_frame


def fetch(version: int) -> RequestContext:
    frame = memoryview(request_frame(FETCH, version, 7, b"\x00" * 30, flexible=version >= 12))
    return RequestContext(parse_request_header(frame), frame, ConnectionInfo("127.0.0.1:5000", "bootstrap"))


@pytest.mark.parametrize("version", [16, 17])
def test_fetch_v16_and_v17_are_asked_as_v15(version: int) -> None:
    ctx = fetch(version)
    assert FetchAsV15().on_request(ctx) is None  # forwarded, not answered
    assert ctx.api_version == version  # the client's, which its response is framed for
    assert ctx.broker_version == 15
    assert ctx.rewrite is not None and ctx.rewrite.patches == [(API_VERSION_AT, struct.pack(">h", 15))]
    # the patch lands on the header's version: the frame's bytes at API_VERSION_AT
    assert struct.unpack_from(">h", ctx.frame, API_VERSION_AT)[0] == version


@pytest.mark.parametrize("version", [4, 12, 13, 15])
def test_other_versions_pass_untouched(version: int) -> None:
    ctx = fetch(version)
    assert FetchAsV15().on_request(ctx) is None
    assert ctx.rewrite is None and ctx.broker_version == version


def test_it_asks_for_fetch_alone() -> None:
    assert FetchAsV15.api_keys == frozenset({FETCH})
