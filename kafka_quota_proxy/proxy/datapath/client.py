"""One client connection and its own upstream broker connection.

Each client connection gets exactly one upstream connection, so requests keep their order and
any per-connection broker state (SASL, fetch sessions) stays with the client that made it.
Both sides are callback-driven asyncio Protocols: `data_received` splits frames out of the
received bytes (memoryview slices, no copy for whole frames), and flow control is explicit:
when one side's transport cannot keep up, reading from the other side stops.

Kafka clients require responses in request order, and the proxy may answer some requests itself,
so requests wait in one ordered queue (`ResponseQueue`, answers.py) and a response is written
only once every earlier response has been.

A Produce with acks=0 expects no response, and Kafka sends none; some Kafka-compatible brokers
(Tansu) answer it all the same. Such a request is remembered apart rather than queued: an
answer that comes for it is passed on in its place, and one that never comes holds nothing up.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any, cast

from kafka_quota_proxy.config import HostPort
from kafka_quota_proxy.identity.ssl_rules import NoMatchingRule
from kafka_quota_proxy.protocol.api_keys import PRODUCE
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import RequestHeader, parse_request_header
from kafka_quota_proxy.protocol.produce import produce_acks
from kafka_quota_proxy.protocol.proxy_protocol import ProxyHeader, ProxyHeaderParser, ProxyHeaderTimeout
from kafka_quota_proxy.proxy.chain import Response
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.datapath.answers import ResponseQueue
from kafka_quota_proxy.proxy.datapath.host import ConnectionHost
from kafka_quota_proxy.proxy.datapath.intake import Intake, holds
from kafka_quota_proxy.proxy.datapath.local_answers import LocalAnswers
from kafka_quota_proxy.proxy.datapath.mute import Mute
from kafka_quota_proxy.proxy.datapath.read_gate import Pause, ReadGate
from kafka_quota_proxy.proxy.datapath.responses import (
    BadResponse,
    Pending,
    check_correlation,
    describe_request,
)
from kafka_quota_proxy.proxy.datapath.splice import Splice, plain_socket_fd
from kafka_quota_proxy.proxy.datapath.streaming import StreamingResponses
from kafka_quota_proxy.proxy.datapath.upstream import UpstreamConnection, half_close, open_upstream_connection
from kafka_quota_proxy.proxy.stages.sasl_inspect import SaslInspect

log = logging.getLogger("kafka_quota_proxy.connection")

# acks=0 Produce requests remembered per connection in case the broker answers them (`ResponseQueue`):
# the newest this many. A broker that answers does so in turn, long before this many more are
# sent; against one that never answers (Kafka), this bounds what a pure acks=0 stream keeps.
UNASKED_TRACKED = 4096
# After a drain has answered everything, how long a connection waits for the client to close its
# side before closing anyway (`_linger`). Kafka clients close as soon as they read the end.
LINGER_SECONDS = 5.0
FORWARDED = memoryview(b"")  # a forwarded request's frame, let go (`_handle_request`)
# What keeps a connection busy though it waits (`waiting`): held by the proxy, not by its client.
HELD_BY_PROXY = frozenset((Pause.THROTTLE, Pause.AUTHENTICATING, Pause.HELD_RESPONSE))


def header_deadline(proxy: ConnectionHost, expired: Callable[[], None]) -> asyncio.TimerHandle:
    return proxy.loop.call_later(proxy.settings.proxy_protocol_timeout_seconds, expired)


class ClientConnection(LocalAnswers, StreamingResponses, asyncio.Protocol):
    """A Kafka client's connection to one proxy listener."""

    def __init__(self, proxy: ConnectionHost, listener: str,
                 targets: Callable[[], Sequence[HostPort]]) -> None:
        self.proxy = proxy
        self.listener = listener
        self.targets = targets
        self.intake = Intake(proxy.settings.max_frame_bytes)  # requests read, not yet handled
        self.transport: asyncio.Transport | None = None
        self.upstream: UpstreamConnection | None = None
        self.gate: ReadGate | None = None
        self.info = ConnectionInfo("?", listener)
        self._order = ResponseQueue(UNASKED_TRACKED)  # requests whose responses are to go out
        self._draining = False
        self._lingering = False  # drained: half-closed, dropping input until the client closes
        self._linger_timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._early: list[bytes] = []  # bytes that arrived before the upstream connection did
        self._mute = Mute()  # when a throttle lets this connection read again (KIP-219)
        self._streaming: Pending | None = None  # the request whose large response is arriving
        self._splice: Splice | None = None  # moving the rest of that response (splice.py)
        self._fd: int | None = None  # the socket's descriptor when splices may write to it
        self._corked: list[bytes | memoryview] | None = None  # writes held for one writev
        # The timers that end a wait on time, one per reason (`_wait`): a throttle, a paced turn.
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
        self.gate = ReadGate(self.transport)
        if self.proxy.splicing:
            self._fd = plain_socket_fd(transport)
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
        assert self.gate is not None and self.transport is not None
        self.gate.pause(Pause.CONNECTING)
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
            if self._closed and not self._early:
                upstream.transport.close()  # type: ignore[union-attr]
                return
            self.upstream = upstream
            self.info.upstream = str(target)
            assert self.gate is not None
            self.gate.resume(Pause.CONNECTING)
            early, self._early = self._early, []
            for data in early:
                self._receive(data)
            if self._closed:
                # The client left meanwhile: what it sent still reaches the broker, as it would
                # had it left a moment later.
                upstream.linger()
            return
        if not self._closed:
            log.warning("closing connection from %s: no broker reachable for %s (%s)",
                        self.info.describe(), self.listener, "; ".join(errors) or "no known address")
            self.close()

    def data_received(self, data: bytes) -> None:
        self.io_count += 1
        if self._closed or self._lingering:
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
        self._receive(data)

    def _receive(self, data: bytes) -> None:
        """Requests out of bytes read from the client, handled in turn unless held."""
        try:
            frames = self.intake.received(data)
        except ProtocolError as exc:
            self._bad_input(exc)
            return
        if frames is not None:
            self._take(frames)

    def _take(self, frames: Sequence[memoryview]) -> None:
        """Handle frames in order, holding the rest as soon as a pause that holds begins."""
        assert self.gate is not None
        out: list[bytes | memoryview] = []
        reasons = self.gate.reasons
        try:
            for i, frame in enumerate(frames):
                if holds(reasons):
                    self.intake.hold(frames[i:])
                    break
                wait_ms = self._handle_request(frame, out)
                if wait_ms:
                    # Its turn (a paced quota) or what it owes: this one first, handled again
                    # then, when it may wait again if another connection of its entity took the turn.
                    self.intake.hold(frames[i:])
                    self._wait(Pause.PACE, self.proxy.loop.time() + wait_ms / 1000)
                    break
        except ProtocolError as exc:
            self._bad_input(exc)
            return
        if out:
            assert self.upstream is not None and self.upstream.transport is not None
            self.upstream.transport.writelines(out)
        if len(self._order.awaiting) >= self._read_ahead():
            # A broker handles one request per connection at a time anyway; reading further
            # ahead would only let a throttled client run past its mute (and hold memory).
            assert self.gate is not None
            self.gate.pause(Pause.INFLIGHT)

    def _read_ahead(self) -> int:
        """How many forwarded requests may wait for their answers before reading stops: one
        for a client over its Produce quota, or over it by its bytes so far, as on a broker
        (`ConnectionInfo.read_alone`, quota_charge.py); else `max_inflight_requests`. Frames
        already read in one go are handled whatever this says."""
        return 1 if self.info.read_alone else self.proxy.settings.max_inflight_requests

    def _release(self) -> None:
        """Handle the held frames, once nothing holds them any more."""
        if not self._closed and self.gate is not None:
            frames = self.intake.release(self.gate.reasons)
            if frames:
                self._take(frames)

    def _header_expired(self) -> None:
        if self._proxy_header is not None and not self._closed:
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

    def _handle_request(self, frame: memoryview, out: list[bytes | memoryview]) -> int:
        """Handle one request; or, when a stage holds it (`RequestStage.hold_ms`), leave it
        untouched and return how long it must wait."""
        sasl = self.info.sasl
        if sasl is not None and sasl.legacy and sasl.mechanism is not None:
            self._legacy_token(frame, out)
            return 0
        received_at = perf_counter()
        header = parse_request_header(frame)
        ctx = RequestContext(header, frame, self.info, received_at=received_at)
        for stage in self.proxy.pipeline.request_holds(header.api_key):
            wait_ms = stage.hold_ms(ctx)
            if wait_ms > 0:
                return wait_ms
        m = self.proxy.metrics.api(header.api_key)
        m.requests += 1
        m.request_bytes += len(frame)
        if header.api_key == PRODUCE:
            ctx.acks = produce_acks(frame, header.body_offset, header.api_version)
            ctx.expects_response = ctx.acks != 0
        reply = None
        for stage in self.proxy.pipeline.request_stages(header.api_key):
            reply = stage.on_request(ctx)
            if reply is not None:
                break
        usage = self.proxy.usage
        if usage is not None:
            usage.request(ctx)
        if reply is not None:
            self._answer_locally(ctx, reply)
            return 0
        if ctx.expects_response:
            pending = self._order.forwarded(ctx)
            if ctx.throttle_ms:
                self.throttle(ctx, pending)
        else:
            self._order.forwarded_unasked(header)
            if ctx.throttle_ms:
                self.throttle(ctx, None)
        ctx.sent_at = perf_counter()
        if ctx.patches is None and ctx.replaced is None:
            out.append(frame)
        else:
            out.extend(ctx.forward_parts())
        # Forwarded: nothing reads the request again, and a request waiting for its response
        # would otherwise keep its frame (up to max_frame_bytes, each of max_inflight_requests).
        ctx.frame = FORWARDED
        return 0

    def _bad_input(self, exc: ProtocolError) -> None:
        self.proxy.metrics.protocol_errors.labels(exc.kind).inc()
        log.warning("closing connection from %s: %s: %s", self.info.describe(), exc.kind, exc)
        self.close()

    def pause_writing(self) -> None:
        # The client is not reading its responses: stop handling its requests too (a broker
        # reads no request while a response is unsent), or the proxy's own answers, which the
        # in-flight bound does not count, would pile up in the write buffer without bound.
        if self.gate is not None:
            self.gate.pause(Pause.CLIENT_BUSY)
        if self.upstream is not None and self.upstream.gate is not None:
            self.upstream.gate.pause(Pause.CLIENT_BUSY)

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.gate is not None:
            self.upstream.gate.resume(Pause.CLIENT_BUSY)
        if self.gate is not None:
            self.gate.resume(Pause.CLIENT_BUSY)
            self._release()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
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
            self._answered(head)

    def owed_by_broker(self) -> tuple[int, int]:
        """Forwarded requests still to be answered, and acks=0 Produce requests that may be."""
        return len(self._order.awaiting), len(self._order.unasked)

    def on_response(self, frame: memoryview) -> None:
        """Called by the upstream connection for each complete response frame."""
        self._respond(self._answered(frame), frame)

    def _answered(self, head: bytes | memoryview) -> Pending:
        """The request the broker's response starting with `head` answers. Responses come in
        request order: the oldest forwarded request still waiting, unless an acks=0 Produce
        forwarded before it has this correlation id (a broker that answers those)."""
        found = self._order.answered(head)
        if not isinstance(found, Pending):
            return self._unasked_answer(*found)
        pending = found
        pending.ctx.answered_at = perf_counter()
        if len(self._order.awaiting) < self._read_ahead() and self.gate is not None:
            self.gate.resume(Pause.INFLIGHT)
        return pending

    def _unasked_answer(self, seq: int, header: RequestHeader) -> Pending:
        ctx = RequestContext(header, memoryview(b""), self.info, received_at=perf_counter())
        ctx.answered_at = ctx.received_at
        pending = Pending(ctx, seq=seq)
        pending.unasked = True
        return pending

    def _respond(self, pending: Pending, frame: memoryview) -> None:
        ctx = pending.ctx
        if pending.unasked:
            # Passed on as the broker sent it (the request was charged when it was read), in its
            # place: after every earlier response still queued, before every later one.
            pending.response = bytes(frame)
            self._order.put_back(pending)
            self._flush()
            return
        response: Response
        if ctx.raw:  # the broker's bare answer to a legacy SASL token
            stage = self.proxy.sasl_stage
            assert isinstance(stage, SaslInspect)
            stage.legacy_answer(ctx)
            response = bytes(frame)
        else:
            try:
                check_correlation(ctx, frame)
                m = self.proxy.metrics.api(ctx.api_key)
                m.observe_latency(ctx.answered_at - ctx.sent_at)
                response = self.proxy.pipeline.run_response_stages(ctx, frame)
            except ProtocolError as exc:
                raise BadResponse(ctx, exc) from exc
        if ctx.hold is not None:
            # A response stage needs something done before this response goes out (a delegation
            # token's owner asked of the broker, sasl_inspect.py): the response, and every
            # request read after it, wait until it is. Kept past this read: a view of the
            # broker's bytes becomes bytes of its own.
            if isinstance(response, list):
                response = b"".join(response)
            elif isinstance(response, memoryview):
                response = bytes(response)
            self._await(Pause.HELD_RESPONSE, ctx.hold, functools.partial(self._ready, pending, response))
            return
        self._ready(pending, response)

    def _ready(self, pending: Pending, response: Response) -> None:
        pending.response = response
        self._flush()

    def _await(self, reason: Pause, future: asyncio.Future[Any], then: Callable[[], None]) -> None:
        """Read nothing more until `future` is done, for `reason`: the one way this connection
        waits on work done elsewhere (a PLAIN password checked on a worker thread, a delegation
        token's owner asked of the broker). Then `then()`, and the frames read meanwhile are
        handled, in order. A future that fails closes this connection (a ProtocolError as bad
        input; anything else is a bug, logged), and so does one cancelled: no answer will come,
        and the connection is never left held."""
        assert self.gate is not None
        self.gate.pause(reason)

        def done(future: asyncio.Future[Any]) -> None:
            if self.gate is not None:
                self.gate.resume(reason)
            if self._closed:
                return
            problem = (asyncio.CancelledError("no answer will come") if future.cancelled()
                       else future.exception())
            if isinstance(problem, ProtocolError):
                self._bad_input(problem)
                return
            if problem is not None:
                log.error("closing connection from %s: %r, waiting (%s)", self.info.describe(), problem,
                          reason)
                self.close()
                return
            then()
            self._release()
        future.add_done_callback(done)

    def _write(self, data: Response) -> None:
        if self._closed or self._lingering or self.transport is None:
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
        if corked and not self._closed and self.transport is not None:
            self.transport.writelines(corked)

    def _flush(self) -> None:
        """Write every response at the head of the queue that is ready, in order."""
        order = self._order
        assert self.transport is not None
        while (pending := order.next_ready()) is not None:
            response = pending.response
            if isinstance(response, list):
                size = sum(len(piece) for piece in response)
            else:
                assert response is not None
                size = len(response)
            self._write(response)
            self._written(pending, size)
        if self._draining and not order.inflight:
            self._linger()

    def _written(self, pending: Pending, size: int) -> None:
        """A response has gone out whole: count it, and start its throttle."""
        self.proxy.metrics.api(pending.ctx.api_key).response_bytes += size
        usage = self.proxy.usage
        if usage is not None and not pending.unasked:
            usage.response(pending.ctx, size)
        if pending.throttle_due:
            self._mute.answered()
        if pending.ctx.throttle_ms:
            self.mute(pending.ctx.throttle_ms)

    def throttle(self, ctx: RequestContext, pending: Pending | None) -> None:
        """Apply a request's throttle (`ctx.throttle_ms`) to the connection: where a request
        charged over its quota is forwarded with a response to come (`pending`), nothing more is
        read, and the throttle runs from when that response goes out (`_written`), as on a
        broker; with no response (acks=0, or refused without an answer), it runs from now."""
        if pending is None:
            self.mute(ctx.throttle_ms)
            return
        pending.throttle_due = True
        self._mute.charged_over()
        assert self.gate is not None
        self.gate.pause(Pause.THROTTLE)

    def mute(self, throttle_ms: int) -> None:
        """Stop reading this client's requests for the throttle time (KIP-219), for old and new
        clients alike: the response has gone out at once, the next request waits unread."""
        if self.gate is None or self._closed or self._lingering:
            return
        self.gate.pause(Pause.THROTTLE)
        until = self._mute.start(self.proxy.loop.time(), throttle_ms)
        if until is not None:  # else a longer throttle already holds
            self._wait(Pause.THROTTLE, until)

    def _wait(self, reason: Pause, until: float) -> None:
        """Read nothing more until `until` (loop time) for `reason`: the one way this connection
        waits on time (a throttle's mute, a paced quota's turn, a throttle still owed). A later
        wait for the same reason replaces the earlier. The frames already read wait with it, and
        are handled, in order, when it ends (`_waited`)."""
        assert self.gate is not None
        self.gate.pause(reason)
        timer = self._timers.get(reason)
        if timer is not None:
            timer.cancel()
        self._timers[reason] = self.proxy.loop.call_at(until, self._waited, reason)

    def _waited(self, reason: Pause) -> None:
        del self._timers[reason]
        if reason is Pause.THROTTLE and not self._mute.may_end():
            return  # a response over quota is still to go out; its own mute ends the pause
        if self.gate is not None:
            self.gate.resume(reason)
            self._release()

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
        elif (oldest := self._order.oldest_awaiting()) is not None:
            answers = describe_request(oldest.ctx)
        else:
            answers = "no request"
        log.error("closing connection from %s: bad response from broker %s to %s: %s: %s",
                  self.info.describe(), broker, answers, exc.kind, exc)
        self._closed = True  # connection_lost follows; nothing more is said about either side
        self.close()

    def upstream_lost(self, reason: str | None) -> None:
        if not self._closed and not self._lingering:
            if reason:
                log.info("closing connection from %s: broker connection lost: %s",
                            self.info.describe(), reason)
            self.close()

    # -- lifecycle -------------------------------------------------------------------------------

    def io_mark(self) -> tuple[int, int, int]:
        """What moves when a byte is read from or written to the client: the reads and writes,
        the write buffer as the client takes from it, and a splice's progress."""
        transport = self.transport
        return (self.io_count, transport.get_write_buffer_size() if transport is not None else 0,
                self._splice.moved if self._splice is not None else 0)

    def owed(self) -> bool:
        """Whether the connection waits on the proxy or the broker rather than on its client, and
        so is not idle however long that takes: its broker connection is being made; it is
        draining or closing (timers of their own end those); requests it sent are held by the
        proxy (a throttle, an authentication being decided) or are at the broker while the
        client has read everything sent to it. A client that stops reading is owed nothing."""
        if self.upstream is None or self._draining or self._lingering or self._closed or self.intake.held:
            return True
        gate = self.gate
        if gate is not None and not gate.reasons.isdisjoint(HELD_BY_PROXY):
            return True
        transport = self.transport
        return bool(self._order.awaiting) and (transport is None or not transport.get_write_buffer_size())

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
        self._draining = True
        if self.gate is not None:
            self.gate.pause(Pause.SHUTDOWN)
        if not self._order.inflight:
            self._linger()

    def _linger(self) -> None:
        """Close a drained connection without losing its last responses. A socket closed while
        requests the proxy never read wait in it (a client pipelining past max_inflight_requests,
        or held by a throttle) is reset by the kernel, which then throws away what it has not yet
        sent, answers included. So half-close instead, the FIN after the last response; read
        and drop what the client sends; close when the client closes its side, or after
        LINGER_SECONDS. A TLS transport cannot half-close: its close sends close_notify after
        the last response, and the input keeps being read and dropped until then."""
        if self._lingering or self._closed or self.transport is None:
            return
        self._lingering = True
        self._stop_splice()
        self.uncork()
        self.intake.drop()
        self._cancel_waits()  # nothing more is read but to be dropped: no wait is to end
        self._early.clear()
        if self.gate is not None:
            self.gate.open()
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


