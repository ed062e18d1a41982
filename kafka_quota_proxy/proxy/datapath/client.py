"""One client connection and its own upstream broker connection: the asyncio shell around the
connection's rules (core.py), doing its I/O and nothing else.

Each client connection gets exactly one upstream connection, so requests keep their order and
any per-connection broker state (SASL, fetch sessions) stays with the client that made it.
Both sides are callback-driven asyncio Protocols: `data_received` hands the received bytes to
the core, which splits frames out of them (memoryview slices, no copy for whole frames), and
flow control is explicit: when one side's transport cannot keep up, reading from the other side
stops. The core decides, and emits actions (frames to the broker, bytes to the client, reading
paused or resumed, a wait, the end); the shell carries each out as it comes (`_act`): writes,
timers, callbacks on futures, closing. Before the core sees any bytes come the PROXY protocol
header, admission, identity and the broker connection, all the shell's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

from kafka_quota_proxy.config import HostPort
from kafka_quota_proxy.identity.ssl_rules import NoMatchingRule
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.framing import FrameHead, FramePiece
from kafka_quota_proxy.protocol.proxy_protocol import ProxyHeader, ProxyHeaderParser, ProxyHeaderTimeout
from kafka_quota_proxy.proxy.chain import Response
from kafka_quota_proxy.proxy.context import ConnectionInfo
from kafka_quota_proxy.proxy.datapath.actions import (
    CANCEL_WAITS,
    CLOSE,
    LINGER,
    Action,
    AwaitWork,
    Reading,
    ToBroker,
    ToClient,
    WaitUntil,
)
from kafka_quota_proxy.proxy.datapath.core import ConnectionCore
from kafka_quota_proxy.proxy.datapath.host import ConnectionHost
from kafka_quota_proxy.proxy.datapath.read_gate import Pause
from kafka_quota_proxy.proxy.datapath.responses import BadResponse, describe_request
from kafka_quota_proxy.proxy.datapath.splice import plain_socket_fd
from kafka_quota_proxy.proxy.datapath.splicing import Splicing
from kafka_quota_proxy.proxy.datapath.streaming import response_head, response_piece
from kafka_quota_proxy.proxy.datapath.upstream import UpstreamConnection, half_close, open_upstream_connection

log = logging.getLogger("kafka_quota_proxy.connection")

# After a drain has answered everything, how long a connection waits for the client to close its
# side before closing anyway (`_linger`). Kafka clients close as soon as they read the end.
LINGER_SECONDS = 5.0


def header_deadline(proxy: ConnectionHost, expired: Callable[[], None]) -> asyncio.TimerHandle:
    return proxy.loop.call_later(proxy.settings.proxy_protocol_timeout_seconds, expired)


class ClientConnection(asyncio.Protocol):
    """A Kafka client's connection to one proxy listener."""

    def __init__(self, proxy: ConnectionHost, listener: str,
                 targets: Callable[[], Sequence[HostPort]]) -> None:
        self.proxy = proxy
        self.listener = listener
        self.targets = targets
        self.transport: asyncio.Transport | None = None
        self.upstream: UpstreamConnection | None = None
        self.info = ConnectionInfo("?", listener)
        self.core = ConnectionCore(proxy, self.info, self._act)  # the connection's rules
        self._linger_timer: asyncio.TimerHandle | None = None
        self._early: list[bytes] = []  # bytes that arrived before the upstream connection did
        self._splicing: Splicing | None = None  # where splices may write to the socket
        self._corked: list[bytes | memoryview] | None = None  # writes held for one writev
        # The timers that end a wait on time, one per reason (`WaitUntil`): a throttle, a paced turn.
        self._timers: dict[Pause, asyncio.TimerHandle] = {}
        self._connect_task: asyncio.Task[None] | None = None
        self._proxy_header: ProxyHeaderParser | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        # A PROXY header read before the TLS handshake (ProxyHeaderThenTls), not in the stream.
        self.proxied: ProxyHeader | None = None
        self.admitted = False  # counted in the proxy's per-IP connection counts
        self.io_count = 0  # reads from and writes to the client, for the idle sweep (idle.py)

    # -- client side ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.info.set_address(str(peer[0]), int(peer[1]))
        if self.proxy.splicing:
            fd = plain_socket_fd(transport)
            if fd is not None:
                self._splicing = Splicing(self.proxy, self.core, self.transport, fd)
        self.proxy.connection_opened(self)
        if self.proxied is not None:
            self._use_proxy_header(self.proxied)
        elif self.proxy.settings.proxy_protocol:
            # The real client address comes first, in a PROXY protocol header; nothing else
            # (admission, identity, the broker connection) can start before it.
            self._proxy_header = ProxyHeaderParser()
            self._header_timer = header_deadline(self.proxy, self._header_expired)
            return
        self._start()

    def _start(self) -> None:
        """Admission, identity, then the broker connection, once the client address is known."""
        assert self.transport is not None
        self.core.pause(Pause.CONNECTING)
        try:
            self.info.principal = self.proxy.identify(self.transport, self.info.ip)
        except (NoMatchingRule, ValueError) as exc:
            # No ssl.principal.mapping.rules rule maps the certificate's subject: Kafka fails the
            # SSL authentication and closes the connection.
            log.warning("closing connection from %s: no principal for the client certificate: %s",
                        self.info.describe(), exc)
            self.close()
            return
        loop = asyncio.get_running_loop()
        delay_ms = self.proxy.admit(self, self.info.ip)
        if delay_ms is not None:
            # Over the connection quota: closed unread after the delay, as a broker does.
            loop.call_later(delay_ms / 1000, self.close)
            return
        self._connect_task = loop.create_task(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        timeout = self.proxy.settings.connect_timeout_seconds
        errors = []
        for target in self.targets():
            try:
                async with asyncio.timeout(timeout):  # not wait_for, which can swallow a cancel (3.11)
                    upstream = await open_upstream_connection(self.proxy, self, target)
            except (TimeoutError, OSError, ProtocolError) as exc:
                self.proxy.metrics.upstream_connect_failures.inc()
                errors.append(f"{target}: {exc or 'timed out'}")
                continue
            if self.core.closed and not self._early:
                upstream.transport.close()  # type: ignore[union-attr]
                return
            self.upstream = upstream
            self.info.upstream = str(target)
            self.info.quotas = self.proxy.quota_scope(self.info.upstream)
            self.core.resume(Pause.CONNECTING, self.proxy.loop.time())
            early, self._early = self._early, []
            for data in early:
                self.core.client_bytes(data, self.proxy.loop.time())
            if self.core.closed:
                # The client left meanwhile: what it sent still reaches the broker, as it would
                # had it left a moment later.
                upstream.linger()
            return
        if not self.core.closed:
            log.warning("closing connection from %s: no broker reachable for %s (%s)",
                        self.info.describe(), self.listener, "; ".join(errors) or "no known address")
            self.close()

    def data_received(self, data: bytes) -> None:
        self.io_count += 1
        if self.core.closed or self.core.lingering:
            return
        if self._proxy_header is not None:
            self._receive_proxy_header(data)
            return
        if self.upstream is None:
            # Reading is paused until the broker connection is up, but uvloop starts reading
            # after connection_made whatever was asked there: keep this read and pause again.
            self._early.append(data)
            if self.transport is not None:
                self.transport.pause_reading()
            return
        self.core.client_bytes(data, self.proxy.loop.time())

    def _header_expired(self) -> None:
        if self._proxy_header is not None and not self.core.closed:
            self._bad_input(ProxyHeaderTimeout(self.proxy.settings.proxy_protocol_timeout_seconds))

    def _receive_proxy_header(self, data: bytes) -> None:
        assert self._proxy_header is not None
        try:
            header = self._proxy_header.feed(data)
        except ProtocolError as exc:
            self._bad_input(exc)
            return
        if header is None:
            return
        rest = self._proxy_header.remaining
        self._proxy_header = None
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._use_proxy_header(header)
        if rest:
            self._early.append(bytes(rest))

    def _use_proxy_header(self, header: ProxyHeader) -> None:
        if header.source is not None:  # LOCAL (a health check) keeps the balancer's address
            self.info.set_address(header.source[0], header.source[1])
        self._start()

    def _bad_input(self, exc: ProtocolError) -> None:
        self.core.bad_input(exc)

    def pause_writing(self) -> None:
        # The client is not reading its responses: stop handling its requests too (a broker
        # reads no request while a response is unsent), or the proxy's own answers, which the
        # in-flight bound does not count, would pile up in the write buffer without bound.
        self.core.pause(Pause.CLIENT_BUSY)
        if self.upstream is not None and self.upstream.gate is not None:
            self.upstream.gate.pause(Pause.CLIENT_BUSY)

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.gate is not None:
            self.upstream.gate.resume(Pause.CLIENT_BUSY)
        self.core.resume(Pause.CLIENT_BUSY, self.proxy.loop.time())

    def connection_lost(self, exc: Exception | None) -> None:
        self.core.closed = True
        self._stop_splice()
        if self.upstream is not None:
            # Not abort(): requests already read (acks=0 records among them) still reach the
            # broker, and it gets to handle them (UpstreamConnection.linger).
            self.upstream.linger()
        elif self._connect_task is not None and not self._connect_task.done() and not self._early:
            self._connect_task.cancel()  # else it forwards what was read once connected
        self._cancel_waits()
        if self._header_timer is not None:
            self._header_timer.cancel()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        self.proxy.connection_closed(self)

    # -- broker side -----------------------------------------------------------------------------

    def answered_late(self, head: bytes | memoryview) -> None:
        """A response (or its head) the broker sent after the client left: only counted, so that
        the lingering broker connection knows what it is still owed (upstream.py, `linger`)."""
        with contextlib.suppress(ProtocolError):
            self.core.answered(head, self.proxy.loop.time())

    def owed_by_broker(self) -> tuple[int, int]:
        """Forwarded requests still to be answered, and acks=0 Produce requests that may be."""
        order = self.core.order
        return len(order.awaiting), len(order.unasked)

    def on_response(self, frame: memoryview) -> None:
        """Called by the upstream connection for each complete response frame."""
        self.core.response(frame, self.proxy.loop.time())

    def on_response_head(self, head: FrameHead) -> None:
        """The start of a large response (StreamingFrameDecoder): see streaming.py."""
        response_head(self.core, head, self.proxy.loop.time())

    def on_response_piece(self, piece: FramePiece) -> None:
        response_piece(self.core, piece, self.proxy.loop.time())

    def splice_rest(self, upstream: UpstreamConnection) -> None:
        """Called after each read from the broker (splicing.py)."""
        if self._splicing is not None:
            self._splicing.rest(upstream)

    def _stop_splice(self) -> None:
        if self._splicing is not None:
            self._splicing.stop()

    def broker_busy(self, busy: bool) -> None:
        """The broker is not reading this connection's requests (`busy`), or reads them again:
        reading the client's stops meanwhile."""
        if busy:
            self.core.pause(Pause.UPSTREAM_BUSY)
        else:
            self.core.resume(Pause.UPSTREAM_BUSY, self.proxy.loop.time())

    # -- carrying out the core's actions --------------------------------------------------------

    def _act(self, action: Action) -> None:
        """Carry out one of the core's actions, as it is emitted."""
        if isinstance(action, ToClient):
            self._write(action.data)
        elif isinstance(action, ToBroker):
            assert self.upstream is not None and self.upstream.transport is not None
            self.upstream.transport.writelines(action.parts)
        elif isinstance(action, Reading):
            transport = self.transport
            if transport is not None and not transport.is_closing():
                if action.on:
                    transport.resume_reading()
                else:
                    transport.pause_reading()
        elif isinstance(action, WaitUntil):
            timer = self._timers.get(action.reason)
            if timer is not None:
                timer.cancel()
            self._timers[action.reason] = self.proxy.loop.call_at(action.until, self._waited, action.reason)
        elif isinstance(action, AwaitWork):
            action.work.add_done_callback(functools.partial(self._settled, action.token))
        elif action is CLOSE:
            self.close()
        elif action is LINGER:
            self._linger()
        elif action is CANCEL_WAITS:
            self._cancel_waits()
        else:  # pragma: no cover - every action is one of the above
            raise AssertionError(f"unknown action {action!r}")

    def _waited(self, reason: Pause) -> None:
        del self._timers[reason]
        self.core.waited(reason, self.proxy.loop.time())

    def _settled(self, token: int, future: asyncio.Future[Any]) -> None:
        problem = (asyncio.CancelledError("no answer will come") if future.cancelled()
                   else future.exception())
        self.core.settled(token, problem, self.proxy.loop.time())

    def _write(self, data: Response) -> None:
        if self.core.closed or self.core.lingering or self.transport is None:
            return
        self.io_count += 1
        corked = self._corked
        if corked is not None:
            if isinstance(data, list):
                corked.extend(data)
            else:
                corked.append(data)
        elif isinstance(data, list):
            self.transport.writelines(data)
        else:
            self.transport.write(data)

    def cork(self) -> None:
        """Gather what is written until `uncork`: the responses one read from the broker
        completes go out in one writev rather than a write each (a system call per response was
        the largest cost of small responses)."""
        self._corked = []

    def uncork(self) -> None:
        corked, self._corked = self._corked, None
        if corked and not self.core.closed and self.transport is not None:
            self.transport.writelines(corked)

    def _cancel_waits(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def bad_response(self, exc: ProtocolError, broker: str) -> None:
        """The broker sent what is no answer to this connection's requests, and its connection
        has been aborted: one line naming the request (a frame that did not even split names
        the next one due), then this connection is closed too."""
        if isinstance(exc, BadResponse):
            answers = exc.answers
        elif (oldest := self.core.order.oldest_awaiting()) is not None:
            answers = describe_request(oldest.ctx)
        else:
            answers = "no request"
        log.error("closing connection from %s: bad response from broker %s to %s: %s: %s",
                  self.info.describe(), broker, answers, exc.kind, exc)
        self.core.closed = True  # connection_lost follows; nothing more is said about either side
        self.close()

    def upstream_lost(self, reason: str | None) -> None:
        self.core.broker_lost(reason)

    # -- lifecycle -------------------------------------------------------------------------------

    def io_mark(self) -> tuple[int, int, int]:
        """What moves when a byte is read from or written to the client: the reads and writes,
        the write buffer as the client takes from it, and a splice's progress."""
        transport = self.transport
        return (self.io_count, transport.get_write_buffer_size() if transport is not None else 0,
                self._splicing.moved if self._splicing is not None else 0)

    def owed(self) -> bool:
        """Whether the connection waits on the proxy or the broker rather than on its client, and
        so is not idle however long that takes: its broker connection is being made; it is
        draining or closing (timers of their own end those); requests it sent are held by the
        proxy (a throttle, an authentication being decided) or are at the broker while the
        client has read everything sent to it. A client that stops reading is owed nothing."""
        if self.upstream is None or self.core.held_by_proxy():
            return True
        transport = self.transport
        return bool(self.core.order.awaiting) and (transport is None or not transport.get_write_buffer_size())

    def close_idle(self, max_idle: float) -> None:
        """Close a connection found idle for `max_idle` seconds (idle.py)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        log.debug("closing connection from %s: no byte read or written for %.0f ms "
                  "(connections_max_idle_ms)", self.info.describe(), max_idle * 1000)
        self.proxy.metrics.idle_connections_closed.inc()
        if transport.get_write_buffer_size():
            transport.abort()  # a client that stopped reading: what is buffered would never go
        else:
            self.close()

    def begin_drain(self) -> None:
        """Stop reading new requests; close once every in-flight request has its response."""
        self.core.begin_drain(self.proxy.loop.time())

    def _linger(self) -> None:
        """Close a drained connection without losing its last responses. A socket closed while
        requests the proxy never read wait in it (a client pipelining past max_inflight_requests,
        or held by a throttle) is reset by the kernel, which then throws away what it has not yet
        sent, answers included. So half-close instead, the FIN after the last response; read
        and drop what the client sends; close when the client closes its side, or after
        LINGER_SECONDS. A TLS transport cannot half-close: its close sends close_notify after
        the last response, and the input keeps being read and dropped until then. The core has
        let go of what waited and opened the gate (`ConnectionCore._linger`)."""
        if self.transport is None:
            return
        self._stop_splice()
        self.uncork()
        self._early.clear()
        transport = self.transport
        if transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        if half_close(transport):  # after what is still buffered
            self._linger_timer = self.proxy.loop.call_later(LINGER_SECONDS, self._end_linger)

    def _end_linger(self) -> None:
        self._linger_timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def close(self) -> None:
        self._stop_splice()  # a response cut short: the client cannot use the rest of it
        self.uncork()  # what was written before closing still goes out
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


