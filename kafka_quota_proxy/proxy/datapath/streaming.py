"""Large broker responses as they arrive: a Fetch whose response stages all work from its head is
written on to the client piece by piece (cut-through), and the bulk of it may move with
splice(2) (splice.py); any other large response is gathered whole first."""

from __future__ import annotations

import asyncio
import logging

from kafka_quota_proxy.protocol.api_keys import FETCH
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.framing import FrameHead, FramePiece
from kafka_quota_proxy.protocol.headers import response_body_offset, response_prefix
from kafka_quota_proxy.proxy.context import ConnectionInfo
from kafka_quota_proxy.proxy.datapath.core import ConnectionCore
from kafka_quota_proxy.proxy.datapath.host import ConnectionHost
from kafka_quota_proxy.proxy.datapath.read_gate import Pause
from kafka_quota_proxy.proxy.datapath.responses import (
    ASSEMBLE,
    DISCARD,
    STREAM,
    BadResponse,
    Pending,
    check_correlation,
)
from kafka_quota_proxy.proxy.datapath.splice import SPLICE_FROM, Splice, SpliceFailed
from kafka_quota_proxy.proxy.datapath.upstream import UpstreamConnection
from kafka_quota_proxy.proxy.stages.base import Replacement, ResponseStage

log = logging.getLogger("kafka_quota_proxy.connection")


class StreamingResponses:
    """ClientConnection's handling of large responses, the I/O side of it: what it shares with
    the connection is declared here; the rules (order, throttles) are the core's."""

    proxy: ConnectionHost
    info: ConnectionInfo
    transport: asyncio.Transport | None
    upstream: UpstreamConnection | None
    core: ConnectionCore
    _streaming: Pending | None
    _splice: Splice | None
    _fd: int | None

    def on_response_head(self, head: FrameHead) -> None:
        """The start of a large response (StreamingFrameDecoder). A Fetch whose response stages
        can all work from the head is written on as it arrives; any other is gathered whole and
        then handled like a small one."""
        core = self.core
        pending = core.answered(head.data, self.proxy.loop.time())
        self._streaming = pending
        ctx = pending.ctx
        stages = self.proxy.pipeline.response_stages(ctx.api_key)
        # Gathered whole: not a Fetch, a response before it still to be written, or a stage that
        # needs the whole body. _respond then handles it as any response.
        if (ctx.api_key != FETCH or ctx.raw or pending.unasked or core.closed
                or not core.order.first(pending)
                or not all(stage.streams or not stage.wants(ctx) for stage in stages)):
            pending.stream = ASSEMBLE
            pending.parts = [memoryview(head.data)]
            return
        try:
            self._stream(pending, head, stages)
        except ProtocolError as exc:
            raise BadResponse(ctx, exc) from exc

    def _stream(self, pending: Pending, head: FrameHead, stages: tuple[ResponseStage, ...]) -> None:
        """A Fetch's head through its response stages, then written on (or replaced)."""
        ctx = pending.ctx
        check_correlation(ctx, head.data)
        m = self.proxy.metrics.api(ctx.api_key)
        m.observe_latency(ctx.answered_at - ctx.sent_at)
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
                self.core.flush()
                return
            if result is not None:
                assert len(result) == len(body), "a streamed head must keep its length"
                body = result
        pending.stream = STREAM
        pending.size = head.size
        if not isinstance(body, memoryview):  # changed: the header, then the new start of the body
            self.core.write(head.data[:body_at] + body)
        else:
            self.core.write(head.data)

    def on_response_piece(self, piece: FramePiece) -> None:
        pending = self._streaming
        assert pending is not None
        mode = pending.stream
        if mode is STREAM:
            self.core.write(piece.data)
        elif mode is ASSEMBLE:
            assert pending.parts is not None
            pending.parts.append(piece.data)  # a view of an immutable chunk: joined once, at the end
        if not piece.last:
            return
        self._streaming = None
        if mode is ASSEMBLE:
            assert pending.parts is not None
            frame = memoryview(b"".join(pending.parts))
            pending.parts = None
            self.core.respond(pending, frame, self.proxy.loop.time())
        elif mode is STREAM:
            self.core.streamed(pending, self.proxy.loop.time())


    def splice_rest(self, upstream: UpstreamConnection) -> None:
        """Called after each read from the broker: when the response being written on has much
        still to come and both sockets are plain TCP, move the rest with splice(2) (splice.py)
        instead of reading it. The broker's socket is not read meanwhile."""
        pending = self._streaming
        if (pending is None or pending.stream is not STREAM or self._fd is None or upstream.fd is None
                or self.core.closed or self._splice is not None or upstream.gate is None):
            return
        size = upstream.decoder.streaming_left
        if size < SPLICE_FROM:
            return
        try:
            splice = Splice(self.proxy.loop, self.proxy.pipes, upstream.fd, self._fd, self.transport, size,
                            self._spliced)
        except OSError as exc:  # out of descriptors: the bytes come through data_received instead
            log.debug("no splice for %s: %s", self.info.describe(), exc)
            return
        upstream.decoder.take_rest()
        upstream.gate.pause(Pause.SPLICE)
        self._splice = splice
        splice.start()  # may finish at once, when every byte is already there

    def _spliced(self, failure: SpliceFailed | None) -> None:
        splice, self._splice = self._splice, None
        pending, self._streaming = self._streaming, None
        assert splice is not None and pending is not None
        upstream = self.upstream
        if failure is not None:
            # The client has part of a response: neither connection can go on.
            log.info("closing connection from %s: %s failed mid-response: %s", self.info.describe(),
                     "broker connection" if failure.side == "broker" else "client connection", failure.reason)
            self.core.closed = True  # connection_lost follows; nothing more is said about either side
            if upstream is not None and upstream.transport is not None:
                upstream.transport.abort()
            if self.transport is not None:
                self.transport.abort()
            return
        self.proxy.metrics.spliced_bytes.inc(splice.moved)
        self.core.streamed(pending, self.proxy.loop.time())
        if upstream is not None and upstream.gate is not None:
            upstream.gate.resume(Pause.SPLICE)

    def _stop_splice(self) -> None:
        if self._splice is not None:
            self._splice.cancel()
            self._splice = None
