"""A client connection's splices, the shell's side of them (sockets and the loop): the rest of a
response being written on (streaming.py) moved with splice(2) (splice.py) instead of read, when
both sockets are plain TCP and much of it is still to come."""

from __future__ import annotations

import asyncio
import logging

from kafka_quota_proxy.proxy.datapath.core import ConnectionCore
from kafka_quota_proxy.proxy.datapath.host import ConnectionHost
from kafka_quota_proxy.proxy.datapath.read_gate import Pause
from kafka_quota_proxy.proxy.datapath.responses import STREAM
from kafka_quota_proxy.proxy.datapath.splice import SPLICE_FROM, Splice, SpliceFailed
from kafka_quota_proxy.proxy.datapath.upstream import UpstreamConnection

log = logging.getLogger("kafka_quota_proxy.connection")


class Splicing:
    """Splices for one client connection whose socket is plain TCP (`fd`), one at a time."""

    __slots__ = ("proxy", "core", "transport", "fd", "splice", "upstream")

    def __init__(self, proxy: ConnectionHost, core: ConnectionCore, transport: asyncio.Transport,
                 fd: int) -> None:
        self.proxy = proxy
        self.core = core
        self.transport = transport
        self.fd = fd
        self.splice: Splice | None = None  # moving the rest of the response being written on
        self.upstream: UpstreamConnection | None = None

    @property
    def moved(self) -> int:
        """The bytes the splice under way has moved (for the idle sweep: it is progress)."""
        return self.splice.moved if self.splice is not None else 0

    def rest(self, upstream: UpstreamConnection) -> None:
        """After a read from the broker: when the response being written on has much still to
        come, move the rest with splice(2) instead of reading it. The broker's socket is not
        read meanwhile."""
        pending = self.core.streaming
        if (pending is None or pending.stream is not STREAM or upstream.fd is None
                or self.core.closed or self.splice is not None or upstream.gate is None):
            return
        size = upstream.decoder.streaming_left
        if size < SPLICE_FROM:
            return
        try:
            splice = Splice(self.proxy.loop, self.proxy.pipes, upstream.fd, self.fd, self.transport, size,
                            self._done)
        except OSError as exc:  # out of descriptors: the bytes come through data_received instead
            log.debug("no splice for %s: %s", self.core.info.describe(), exc)
            return
        upstream.decoder.take_rest()
        upstream.gate.pause(Pause.SPLICE)
        self.splice = splice
        self.upstream = upstream
        splice.start()  # may finish at once, when every byte is already there

    def _done(self, failure: SpliceFailed | None) -> None:
        core = self.core
        splice, self.splice = self.splice, None
        upstream, self.upstream = self.upstream, None
        pending, core.streaming = core.streaming, None
        assert splice is not None and pending is not None and upstream is not None
        if failure is not None:
            # The client has part of a response: neither connection can go on.
            log.info("closing connection from %s: %s failed mid-response: %s", core.info.describe(),
                     "broker connection" if failure.side == "broker" else "client connection", failure.reason)
            core.closed = True  # connection_lost follows; nothing more is said about either side
            if upstream.transport is not None:
                upstream.transport.abort()
            self.transport.abort()
            return
        self.proxy.metrics.spliced_bytes.inc(splice.moved)
        core.streamed(pending, self.proxy.loop.time())
        if upstream.gate is not None:
            upstream.gate.resume(Pause.SPLICE)

    def stop(self) -> None:
        """A response cut short (the connection closing): the client cannot use the rest of it."""
        if self.splice is not None:
            self.splice.cancel()
            self.splice = None
            self.upstream = None
