"""The rules of one client connection, with no socket, no event loop and no clock (h11's model).

The shell (client.py) tells the core what happened, with the loop's time: bytes read from the
client, a response from the broker, a wait's end, work done elsewhere. The core decides, and
emits the actions the shell is to carry out, in order (actions.py). Tests feed it bytes on a fake
clock and read the actions (tests/proxy/datapath/test_core.py). It keeps the requests read and not yet
handled (`Intake`), the response order (`ResponseQueue`), the throttle's mute (`Mute`), and why
reading is paused (`reasons`). Every wait is for a `Pause` reason, until a time (a throttle, a
paced turn, an answer held back) or until work done elsewhere is (a PLAIN password checked on a
worker thread, a delegation token's owner asked of the broker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from heapq import heappop, heappush
from itertools import count
from time import perf_counter
from typing import Any

from kafka_quota_proxy.protocol.api_keys import PRODUCE
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.produce import produce_acks
from kafka_quota_proxy.proxy.chain import Response
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext, Times
from kafka_quota_proxy.proxy.datapath.actions import (
    CANCEL_WAITS,
    CLOSE,
    LINGER,
    Action,
    AwaitWork,
    CoreHost,
    EmittedReading,
    ToBroker,
    ToClient,
    WaitUntil,
)
from kafka_quota_proxy.proxy.datapath.answers import ResponseQueue, unasked_answer
from kafka_quota_proxy.proxy.datapath.intake import Intake, holds
from kafka_quota_proxy.proxy.datapath.local_answers import answer_locally, legacy_token
from kafka_quota_proxy.proxy.datapath.mute import Mute
from kafka_quota_proxy.proxy.datapath.read_gate import HELD_BY_PROXY, Pause, ReadGate
from kafka_quota_proxy.proxy.datapath.responses import BadResponse, Pending, check_correlation
from kafka_quota_proxy.proxy.stages.sasl_inspect import SaslInspect

log = logging.getLogger("kafka_quota_proxy.connection")

# acks=0 Produce requests remembered per connection in case the broker answers them (`ResponseQueue`):
# the newest this many. A broker that answers does so in turn, long before this many more are
# sent; against one that never answers (Kafka), this bounds what a pure acks=0 stream keeps.
UNASKED_TRACKED = 4096
FORWARDED = memoryview(b"")  # a forwarded request's frame, let go (`_handle_request`)


class ConnectionCore:
    """A client connection's logic: requests in, in order; responses out, in request order;
    throttles, paced turns and holds as waits; draining. `emit` carries each action out."""

    def __init__(self, host: CoreHost, info: ConnectionInfo, emit: Callable[[Action], None],
                 stamp: Callable[[], float] = perf_counter) -> None:
        self.host = host
        self.info = info
        self.emit = emit
        # Times a request's way through the proxy, for the latency metrics and the request quota
        # (perf_counter: uvloop's loop time ticks in whole milliseconds); decides nothing here.
        self.stamp = stamp
        self.intake = Intake(host.settings.max_frame_bytes)  # requests read, not yet handled
        self.order = ResponseQueue(UNASKED_TRACKED)  # requests whose responses are to go out
        self.mute = Mute()  # when a throttle lets this connection read again (KIP-219)
        self.gate = ReadGate(EmittedReading(emit))  # reading paused while any reason holds
        self.reasons = self.gate.reasons  # why reading is paused
        self.now = 0.0  # the loop time of what the shell told last
        self.draining = False
        self.lingering = False  # drained: half-closed, dropping input until the client closes
        self.closed = False
        self.streaming: Pending | None = None  # the request whose large response is arriving
        self._work: dict[int, tuple[Pause, Callable[[], None]]] = {}  # awaited, by token
        self._tokens = count()
        self._delayed: list[tuple[float, int, Pending, bytes]] = []  # answers held back, a heap

    # -- reading ----------------------------------------------------------------------------

    def pause(self, reason: Pause) -> None:
        """Stop reading from the client while `reason` holds."""
        self.gate.pause(reason)

    def _resume(self, reason: Pause) -> None:
        self.gate.resume(reason)

    def resume(self, reason: Pause, now: float) -> None:
        """`reason` holds no longer: read again if nothing else holds, and handle the requests
        read meanwhile."""
        self.now = now
        self._resume(reason)
        self._release()

    def client_bytes(self, data: bytes, now: float) -> None:
        """Bytes read from the client: its requests handled in turn, unless held."""
        self.now = now
        try:
            frames = self.intake.received(data)
        except ProtocolError as exc:
            self.bad_input(exc)
            return
        if frames is not None:
            self._take(frames)

    def _take(self, frames: Sequence[memoryview]) -> None:
        """Handle frames in order, holding the rest as soon as a pause that holds begins."""
        out: list[bytes | memoryview] = []
        reasons = self.reasons
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
                    self.wait(Pause.PACE, self.now + wait_ms / 1000)
                    break
        except ProtocolError as exc:
            self.bad_input(exc)
            return
        if out:
            self.emit(ToBroker(out))
        if len(self.order.awaiting) >= self._read_ahead():
            # A broker handles one request per connection at a time anyway; reading further
            # ahead would only let a throttled client run past its mute (and hold memory).
            self.pause(Pause.INFLIGHT)

    def _read_ahead(self) -> int:
        """How many forwarded requests may wait for their answers before reading stops: one
        for a client over its Produce quota, or over it by its bytes so far, as on a broker
        (`ConnectionInfo.read_alone`, quota_charge.py); else `max_inflight_requests`. Frames
        already read in one go are handled whatever this says."""
        return 1 if self.info.read_alone else self.host.settings.max_inflight_requests

    def _release(self) -> None:
        """Handle the held frames, once nothing holds them any more."""
        if not self.closed:
            frames = self.intake.release(self.reasons)
            if frames:
                self._take(frames)

    def _handle_request(self, frame: memoryview, out: list[bytes | memoryview]) -> int:
        """Handle one request; or, when a stage holds it (`RequestStage.hold_ms`), leave it
        untouched and return how long it must wait."""
        sasl = self.info.sasl
        if sasl is not None and sasl.legacy and sasl.mechanism is not None:
            legacy_token(self, frame, out)
            return 0
        host = self.host
        times = Times(self.stamp())
        header = parse_request_header(frame)
        ctx = RequestContext(header, frame, self.info, times=times)
        for stage in host.pipeline.request_holds(header.api_key):
            wait_ms = stage.hold_ms(ctx)
            if wait_ms > 0:
                return wait_ms
        m = host.metrics.api(header.api_key)
        m.requests += 1
        m.request_bytes += len(frame)
        if header.api_key == PRODUCE:
            ctx.acks = produce_acks(frame, header.body_offset, header.api_version)
        reply = None
        for stage in host.pipeline.request_stages(header.api_key):
            reply = stage.on_request(ctx)
            if reply is not None:
                break
        usage = host.usage
        if usage is not None:
            usage.request(ctx)
        if reply is not None:
            answer_locally(self, ctx, reply)
            return 0
        if ctx.expects_response:
            pending: Pending | None = self.order.forwarded(ctx)
        else:
            pending = None
            self.order.forwarded_unasked(header)
        if ctx.throttle_ms:
            self.throttle(ctx, pending)
        times.sent = self.stamp()
        if ctx.rewrite is None:
            out.append(frame)
        else:
            out.extend(ctx.forward_parts())
        # Forwarded: nothing reads the request again, and a request waiting for its response
        # would otherwise keep its frame (up to max_frame_bytes, each of max_inflight_requests).
        ctx.frame = FORWARDED
        return 0

    def bad_input(self, exc: ProtocolError) -> None:
        """The client sent what is no Kafka request (or no PROXY header): this connection, and
        only this one, is closed."""
        self.host.metrics.protocol_errors.labels(exc.kind).inc()
        log.warning("closing connection from %s: %s: %s", self.info.describe(), exc.kind, exc)
        self.emit(CLOSE)

    def hold_back(self, pending: Pending, frame: bytes, delay_ms: int) -> None:
        """`pending`'s answer, `frame`, goes out (in its turn) only after `delay_ms` (a failed
        authentication's answer is slowed down); reading waits meanwhile."""
        heappush(self._delayed, (self.now + delay_ms / 1000, pending.seq, pending, frame))
        self.wait(Pause.HELD_ANSWER, self._delayed[0][0])

    # -- the broker's responses -------------------------------------------------------------

    def response(self, frame: memoryview, now: float) -> None:
        """A whole response frame from the broker."""
        self.respond(self.answered(frame, now), frame, now)

    def answered(self, head: bytes | memoryview, now: float) -> Pending:
        """The request the broker's response starting with `head` answers. Responses come in
        request order: the oldest forwarded request still waiting, unless an acks=0 Produce
        forwarded before it has this correlation id (a broker that answers those)."""
        self.now = now
        found = self.order.answered(head)
        if not isinstance(found, Pending):
            return unasked_answer(found, self.info, self.stamp())
        pending = found
        pending.ctx.times.answered = self.stamp()
        if len(self.order.awaiting) < self._read_ahead():
            self._resume(Pause.INFLIGHT)
        return pending

    def respond(self, pending: Pending, frame: memoryview, now: float) -> None:
        """`pending`'s whole response: through the response stages, then out in its turn."""
        self.now = now
        ctx = pending.ctx
        if pending.unasked:
            # Passed on as the broker sent it (the request was charged when it was read), in its
            # place: after every earlier response still queued, before every later one.
            pending.response = bytes(frame)
            self.order.put_back(pending)
            self.flush()
            return
        host = self.host
        response: Response
        if ctx.raw:  # the broker's bare answer to a legacy SASL token
            stage = host.sasl_stage
            assert isinstance(stage, SaslInspect)
            stage.legacy_answer(ctx)
            response = bytes(frame)
        else:
            try:
                check_correlation(ctx, frame)
                m = host.metrics.api(ctx.api_key)
                m.observe_latency(ctx.times.answered - ctx.times.sent)
                response = host.pipeline.run_response_stages(ctx, frame)
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
            held = response

            def ready() -> None:
                pending.response = held
                self.flush()
            self.await_work(Pause.HELD_RESPONSE, ctx.hold, ready)
            return
        pending.response = response
        self.flush()

    def write(self, data: Response) -> None:
        """Bytes of a response written on as it arrives (streaming.py)."""
        self.emit(ToClient(data))

    def flush(self) -> None:
        """Write every response at the head of the queue that is ready, in order."""
        order = self.order
        while (pending := order.next_ready()) is not None:
            response = pending.response
            if isinstance(response, list):
                size = sum(len(piece) for piece in response)
            else:
                assert response is not None
                size = len(response)
            self.emit(ToClient(response))
            self.written(pending, size)
        if self.draining and not order.inflight:
            self._linger()

    def streamed(self, pending: Pending, now: float) -> None:
        """A response written on as it arrived has gone out whole."""
        self.now = now
        self.order.streamed(pending)
        self.written(pending, pending.size)
        self.flush()

    def written(self, pending: Pending, size: int) -> None:
        """A response has gone out whole: count it, and start its throttle."""
        host = self.host
        host.metrics.api(pending.ctx.api_key).response_bytes += size
        usage = host.usage
        if usage is not None and not pending.unasked:
            usage.response(pending.ctx, size)
        if pending.throttle_due:
            self.mute.answered()
        if pending.ctx.throttle_ms:
            self._mute_for(pending.ctx.throttle_ms)

    # -- waits ------------------------------------------------------------------------------

    def throttle(self, ctx: RequestContext, pending: Pending | None) -> None:
        """Apply a request's throttle (`ctx.throttle_ms`, RequestContext.throttle_for) to the
        connection: where a request charged over its quota is forwarded with a response to come
        (`pending`), nothing more is read, and the throttle runs from when that response goes
        out (`written`), as on a broker; with no response (acks=0, or refused without an
        answer), it runs from now."""
        if pending is None:
            self._mute_for(ctx.throttle_ms)
            return
        pending.throttle_due = True
        self.mute.charged_over()
        self.pause(Pause.THROTTLE)

    def _mute_for(self, throttle_ms: int) -> None:
        """Stop reading this client's requests for the throttle time (KIP-219), for old and new
        clients alike: the response has gone out at once, the next request waits unread."""
        if self.closed or self.lingering:
            return
        self.pause(Pause.THROTTLE)
        until = self.mute.start(self.now, throttle_ms)
        if until is not None:  # else a longer throttle already holds
            self.wait(Pause.THROTTLE, until)

    def wait(self, reason: Pause, until: float) -> None:
        """Read nothing more until `until` for `reason`: the one way this connection waits on
        time (a throttle's mute, a paced quota's turn, a throttle still owed, an answer held
        back). A later wait for the same reason replaces the earlier. The frames already read
        wait with it, and are handled, in order, when it ends (`waited`)."""
        self.pause(reason)
        self.emit(WaitUntil(reason, until))

    def waited(self, reason: Pause, now: float) -> None:
        """The wait for `reason` has come to its time."""
        self.now = now
        if reason is Pause.HELD_ANSWER:
            self._answers_due()
            if self._delayed:
                return
        elif reason is Pause.THROTTLE and not self.mute.may_end():
            return  # a response over quota is still to go out; its own mute ends the pause
        self._resume(reason)
        self._release()

    def _answers_due(self) -> None:
        """The answers held back whose time has come (the first one's has: its wait ended),
        then a wait for the next."""
        delayed = self._delayed
        _, _, pending, frame = heappop(delayed)
        pending.response = frame
        while delayed and delayed[0][0] <= self.now:
            _, _, pending, frame = heappop(delayed)
            pending.response = frame
        if delayed:
            self.emit(WaitUntil(Pause.HELD_ANSWER, delayed[0][0]))
        self.flush()

    def await_work(self, reason: Pause, work: Any, then: Callable[[], None]) -> None:
        """Read nothing more until `work` (a future) is done, for `reason`: the one way this
        connection waits on work done elsewhere (a PLAIN password checked on a worker thread, a
        delegation token's owner asked of the broker). Then `then()`, and the frames read
        meanwhile are handled, in order (`settled`)."""
        self.pause(reason)
        token = next(self._tokens)
        self._work[token] = (reason, then)
        self.emit(AwaitWork(reason, work, token))

    def settled(self, token: int, problem: BaseException | None, now: float) -> None:
        """Awaited work is done: `problem` is what it raised (a cancellation included), or None.
        One that failed closes this connection (a ProtocolError as bad input; anything else is
        a bug, logged), and so does one cancelled: no answer will come, and the connection is
        never left held."""
        self.now = now
        reason, then = self._work.pop(token)
        self._resume(reason)
        if self.closed:
            return
        if isinstance(problem, ProtocolError):
            self.bad_input(problem)
            return
        if problem is not None:
            log.error("closing connection from %s: %r, waiting (%s)", self.info.describe(), problem, reason)
            self.emit(CLOSE)
            return
        then()
        self._release()

    # -- the end ----------------------------------------------------------------------------

    def broker_lost(self, reason: str | None) -> None:
        """The broker's connection ended (`reason`, when not after the client's): no answer
        will come, and a response cut short cannot be finished, so this connection ends too."""
        if not self.closed and not self.lingering:
            if reason:
                log.info("closing connection from %s: broker connection lost: %s",
                         self.info.describe(), reason)
            self.emit(CLOSE)

    def begin_drain(self, now: float) -> None:
        """Stop reading new requests; close once every in-flight request has its response."""
        self.now = now
        self.draining = True
        self.pause(Pause.SHUTDOWN)
        if not self.order.inflight:
            self._linger()

    def _linger(self) -> None:
        """Drained: nothing more is handled, no wait is to end, and what the client still sends
        is read and dropped until it closes (client.py, `_linger`)."""
        if self.lingering or self.closed:
            return
        self.lingering = True
        self.intake.drop()
        self.emit(CANCEL_WAITS)
        self.gate.open()
        self.emit(LINGER)

    def held_by_proxy(self) -> bool:
        """Whether requests the client sent are held by the proxy rather than by the client: a
        throttle, an authentication being decided, a response held, frames waiting to be
        handled, a drain under way (for the idle sweep, `ClientConnection.owed`)."""
        return (self.draining or self.lingering or self.closed or bool(self.intake.held)
                or not self.reasons.isdisjoint(HELD_BY_PROXY))
