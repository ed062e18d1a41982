"""The proxy's connection to a broker on behalf of one client connection: frames split out of
what the broker sends, small ones whole and large ones as they arrive."""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

from kafka_quota_proxy.config import HostPort
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.framing import FrameHead, FramePiece, StreamingFrameDecoder
from kafka_quota_proxy.proxy.context import ConnectionInfo
from kafka_quota_proxy.proxy.datapath.host import ConnectionHost
from kafka_quota_proxy.proxy.datapath.read_gate import ReadGate
from kafka_quota_proxy.proxy.datapath.splice import plain_socket_fd
from kafka_quota_proxy.proxy.upstream_auth import open_upstream

# A broker response is not bounded by socket.request.max.bytes (fetch.max.bytes can exceed it),
# only by the protocol's int32 size.
MAX_RESPONSE_BYTES = 2**31 - 1
# Responses this large are handed over as they arrive (a Fetch is then written on cut-through).
STREAM_FROM = 64 * 1024
# After its client has gone, how long a broker connection is kept to let the broker finish the
# requests it was sent (`UpstreamConnection.linger`).
LINGER_SECONDS = 30.0
# Over TLS: how long the broker may send nothing, when all the proxy may still be owed is answers
# to acks=0 Produce requests (Kafka sends none), before the connection is ended.
LINGER_QUIET_SECONDS = 1.0


class ResponseSink(Protocol):
    """The client connection an upstream connection hands the broker's responses to."""

    info: ConnectionInfo

    def broker_busy(self, busy: bool) -> None: ...
    def cork(self) -> None: ...
    def uncork(self) -> None: ...
    def on_response(self, frame: memoryview) -> None: ...
    def on_response_head(self, head: FrameHead) -> None: ...
    def on_response_piece(self, piece: FramePiece) -> None: ...
    def splice_rest(self, upstream: UpstreamConnection) -> None: ...
    def upstream_lost(self, reason: str | None) -> None: ...
    def bad_response(self, exc: ProtocolError, broker: str) -> None: ...
    def answered_late(self, head: bytes | memoryview) -> None: ...
    def owed_by_broker(self) -> tuple[int, int]: ...


async def open_upstream_connection(proxy: ConnectionHost, client: ResponseSink,
                                   target: HostPort) -> UpstreamConnection:
    """Connect to the broker at `target` for `client`, authenticating first when the proxy has
    credentials of its own for the broker."""
    loop = asyncio.get_running_loop()
    settings = proxy.settings
    # In passthrough the client authenticates itself to the broker: the proxy's own
    # credentials serve only its metadata refresh.
    creds = settings.upstream_sasl if settings.sasl.mode != "passthrough" else None
    if creds is None:
        _, upstream = await loop.create_connection(
            lambda: UpstreamConnection(client, proxy), target.host, target.port,
            ssl=proxy.upstream_ssl,
            server_hostname=target.host if proxy.upstream_ssl else None)
        return upstream
    # Authenticate on a stream first, then hand the transport to the forwarding protocol.
    reader, writer = await open_upstream(target.host, target.port, proxy.upstream_ssl, creds)
    upstream = UpstreamConnection(client, proxy)
    # A StreamWriter closes its transport when it is garbage-collected: keep it with the
    # connection that now owns the transport.
    upstream.streams = (reader, writer)
    transport = writer.transport
    transport.set_protocol(upstream)
    upstream.connection_made(transport)
    return upstream


def half_close(transport: asyncio.WriteTransport) -> bool:
    """Send the FIN after what is still buffered. False, the transport aborted, where the peer
    has reset the connection unseen (its reading paused, the proxy had not noticed): then
    nothing more can reach it, and write_eof raises."""
    try:
        transport.write_eof()
    except OSError:
        transport.abort()
        return False
    return True


class UpstreamConnection(asyncio.Protocol):
    """The proxy's connection to a broker on behalf of one client connection."""

    def __init__(self, client: ResponseSink, proxy: ConnectionHost) -> None:
        self.client = client
        self.proxy = proxy
        self.decoder = StreamingFrameDecoder(MAX_RESPONSE_BYTES, STREAM_FROM)
        self.transport: asyncio.Transport | None = None
        self.gate: ReadGate | None = None
        # The authenticated stream pair this transport came from, if any.
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.fd: int | None = None  # the socket's descriptor when splices may read from it
        self.lingering: asyncio.TimerHandle | None = None  # the client has gone (`linger`)
        # Over TLS while lingering: when the broker last sent anything, and the next look at it.
        self._heard_at: float | None = None
        self._settling: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.gate = ReadGate(self.transport)
        if self.proxy.splicing:
            self.fd = plain_socket_fd(transport)

    def linger(self) -> None:
        """The client has gone: send the broker what it was sent, end this side, and read on
        (dropping the answers) until the broker ends its side, or for LINGER_SECONDS.

        Closing at once would lose requests: the kernel would reset the connection under the
        broker's next answer, and a broker that answers acks=0 Produce requests (Tansu) drops
        every request it had yet to read when an answer cannot be written. A client that sends
        acks=0 records and disconnects has them all reach such a broker this way, which it would
        not if connected directly. Kafka reads on to the end, answers nothing, and closes.

        TLS has no half-close here: a broker on asyncio closes when it reads close_notify, and
        asyncio's own transport aborts when an answer follows the close_notify it sent. So over
        TLS the connection stays whole while the answers are counted, and is closed once the
        broker owes nothing, or has sent nothing for LINGER_QUIET_SECONDS when all it might owe
        is answers to acks=0 requests (`_settle`)."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.lingering is not None:
            return
        self.lingering = self.proxy.loop.call_later(LINGER_SECONDS, transport.abort)
        if self.gate is not None:
            self.gate.reasons.clear()
            transport.resume_reading()
        if transport.can_write_eof():
            half_close(transport)  # or aborted, where the broker reset it unseen
            return
        self._heard_at = self.proxy.loop.time()
        self._settle()

    def _settle(self) -> None:
        """Over TLS, after the client has gone: close once nothing more is owed (see `linger`)."""
        self._settling = None
        transport = self.transport
        if transport is None or transport.is_closing() or self._heard_at is None:
            return
        awaiting, unasked = self.client.owed_by_broker()
        quiet_until = self._heard_at + LINGER_QUIET_SECONDS
        if not awaiting and (not unasked or self.proxy.loop.time() >= quiet_until):
            if self.lingering is not None:
                self.lingering.cancel()
            transport.close()  # close_notify after the buffered writes
        elif unasked and not awaiting:
            self._settling = self.proxy.loop.call_at(quiet_until, self._settle)

    def _count_late_answers(self, data: bytes) -> None:
        """Over TLS, after the client has gone: the broker's answers, counted and dropped."""
        self._heard_at = self.proxy.loop.time()
        try:
            events = self.decoder.feed(data)
        except ProtocolError:
            if self.transport is not None:
                self.transport.abort()
            return
        for event in events:
            if isinstance(event, memoryview):
                self.client.answered_late(event)
            elif isinstance(event, FrameHead):
                self.client.answered_late(event.data)
        if self._settling is not None:
            self._settling.cancel()
        self._settle()

    def data_received(self, data: bytes) -> None:
        if self.lingering is not None:  # answers for a client that has gone
            if self._heard_at is not None:
                self._count_late_answers(data)
            return
        client = self.client
        client.cork()
        try:
            for event in self.decoder.feed(data):
                kind = type(event)
                if kind is memoryview:
                    client.on_response(event)  # type: ignore[arg-type]
                elif kind is FramePiece:
                    client.on_response_piece(event)  # type: ignore[arg-type]
                else:
                    client.on_response_head(event)  # type: ignore[arg-type]
        except ProtocolError as exc:
            client.uncork()  # the responses before the bad one are the client's
            self.proxy.metrics.protocol_errors.labels("broker_" + exc.kind).inc()
            peer = self.transport.get_extra_info("peername") if self.transport is not None else None
            if self.transport is not None:
                self.transport.abort()
            client.bad_response(exc, str(HostPort(peer[0], peer[1])) if isinstance(peer, tuple) else "?")
        else:
            client.uncork()
            if self.fd is not None and self.decoder.streaming_left:
                client.splice_rest(self)

    def pause_writing(self) -> None:
        self.client.broker_busy(True)

    def resume_writing(self) -> None:
        self.client.broker_busy(False)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._settling is not None:
            self._settling.cancel()
        if self.lingering is not None:
            self.lingering.cancel()
            return
        self.client.upstream_lost(str(exc) if exc else "closed by the broker")
