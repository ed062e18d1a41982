"""Large broker responses as they arrive, as the connection's core (core.py) handles them: a Fetch
whose response stages all work from its head is written on to the client piece by piece
(cut-through); any other large response is gathered whole first, then handled as any response.
Pure: the core emits the writes. The bulk of a response written on may move with splice(2)
instead of being read (`Splicing`, splice.py, the shell's)."""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import FETCH
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.framing import FrameHead, FramePiece
from kafka_quota_proxy.protocol.headers import response_body_offset, response_prefix
from kafka_quota_proxy.proxy.datapath.core import ConnectionCore
from kafka_quota_proxy.proxy.datapath.responses import (
    ASSEMBLE,
    DISCARD,
    STREAM,
    BadResponse,
    Pending,
    check_correlation,
)
from kafka_quota_proxy.proxy.stages.base import Replacement, ResponseStage


def response_head(core: ConnectionCore, head: FrameHead, now: float) -> None:
    """The start of a large response (StreamingFrameDecoder). A Fetch whose response stages can
    all work from the head is written on as it arrives; any other is gathered whole and then
    handled like a small one."""
    pending = core.answered(head.data, now)
    core.streaming = pending
    ctx = pending.ctx
    stages = core.host.pipeline.response_stages(ctx.api_key)
    # Gathered whole: not a Fetch, a response before it still to be written, or a stage that
    # needs the whole body. `ConnectionCore.respond` then handles it as any response.
    if (ctx.api_key != FETCH or ctx.raw or pending.unasked or core.closed
            or not core.order.first(pending)
            or not all(stage.streams or not stage.wants(ctx) for stage in stages)):
        pending.stream = ASSEMBLE
        pending.parts = [memoryview(head.data)]
        return
    try:
        _stream(core, pending, head, stages)
    except ProtocolError as exc:
        raise BadResponse(ctx, exc) from exc


def _stream(core: ConnectionCore, pending: Pending, head: FrameHead,
            stages: tuple[ResponseStage, ...]) -> None:
    """A Fetch's head through its response stages, then written on (or replaced)."""
    ctx = pending.ctx
    check_correlation(ctx, head.data)
    m = core.host.metrics.api(ctx.api_key)
    m.observe_latency(ctx.times.answered - ctx.times.sent)
    spec = ctx.header.spec
    assert spec is not None
    body_at = response_body_offset(head.data, spec.response_header_version(ctx.api_version))
    body: memoryview | bytes = memoryview(head.data)[body_at:]
    body_size = head.size - body_at
    for stage in stages:
        if not stage.wants(ctx):  # asked stage by stage, as in Pipeline.run_response_stages
            continue
        result = stage.on_head(ctx, memoryview(body), body_size)
        if isinstance(result, Replacement):
            # Answered with another body (a Fetch over quota): the rest of this one is dropped.
            pending.stream = DISCARD
            pending.response = response_prefix(head.data, body_at, len(result.body)) + result.body
            core.flush()
            return
        if result is not None:
            assert len(result) == len(body), "a streamed head must keep its length"
            body = result
    pending.stream = STREAM
    pending.size = head.size
    if not isinstance(body, memoryview):  # changed: the header, then the new start of the body
        core.write(head.data[:body_at] + body)
    else:
        core.write(head.data)


def response_piece(core: ConnectionCore, piece: FramePiece, now: float) -> None:
    """More of the large response `response_head` began: written on, gathered or dropped; at
    the last piece, the response is done."""
    pending = core.streaming
    assert pending is not None
    mode = pending.stream
    if mode is STREAM:
        core.write(piece.data)
    elif mode is ASSEMBLE:
        assert pending.parts is not None
        pending.parts.append(piece.data)  # a view of an immutable chunk: joined once, at the end
    if not piece.last:
        return
    core.streaming = None
    if mode is ASSEMBLE:
        assert pending.parts is not None
        frame = memoryview(b"".join(pending.parts))
        pending.parts = None
        core.respond(pending, frame, now)
    elif mode is STREAM:
        core.streamed(pending, now)
