"""Requests the proxy answers itself, as the connection's core (core.py) handles them: a request
stage's Reply (computed at once, or later off the event loop), and the bare SASL tokens that
follow a legacy SaslHandshake v0. Each answer keeps its place in the connection's response
order. Pure: they act through the core, which emits what is to be done."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kafka_quota_proxy.protocol.api_keys import SASL_AUTHENTICATE
from kafka_quota_proxy.protocol.headers import RequestHeader, frame_response, size_prefixed
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext, Times
from kafka_quota_proxy.proxy.datapath.actions import CoreHost
from kafka_quota_proxy.proxy.datapath.answers import ResponseQueue
from kafka_quota_proxy.proxy.datapath.read_gate import Pause
from kafka_quota_proxy.proxy.datapath.responses import Pending
from kafka_quota_proxy.proxy.stages.base import Reply
from kafka_quota_proxy.proxy.stages.sasl_terminate import SaslTerminate


class Answering(Protocol):
    """What these answers use of the connection's core (core.py's ConnectionCore)."""

    host: CoreHost
    info: ConnectionInfo
    order: ResponseQueue
    stamp: Callable[[], float]
    draining: bool

    def pause(self, reason: Pause) -> None: ...
    def flush(self) -> None: ...
    def throttle(self, ctx: RequestContext, pending: Pending | None) -> None: ...
    def await_work(self, reason: Pause, work: Any, then: Callable[[], None]) -> None: ...
    def hold_back(self, pending: Pending, frame: bytes, delay_ms: int) -> None: ...


def answer_locally(core: Answering, ctx: RequestContext, reply: Reply) -> None:
    """A request a stage answered (`reply`) instead of forwarding it."""
    later = reply.later
    if later is not None:
        # Hold this place in the response order until the answer is computed.
        pending = core.order.local(ctx)

        def answered() -> None:
            answer = later.result()
            assert answer.body is not None
            fill(core, pending, frame_reply(ctx, answer.body), answer.delay_ms, answer.close_after)
        core.await_work(Pause.AUTHENTICATING, later, answered)
        return
    if reply.body is None:
        if ctx.throttle_ms:
            core.throttle(ctx, None)  # refused with no response to send (acks=0)
        return
    fill(core, core.order.local(ctx), frame_reply(ctx, reply.body), reply.delay_ms, reply.close_after)


def frame_reply(ctx: RequestContext, body: bytes) -> bytes:
    hv = ctx.header.spec.response_header_version(ctx.api_version) if ctx.header.spec else 0
    return frame_response(ctx.header.correlation_id, hv, body)


def fill(core: Answering, pending: Pending, frame: bytes, delay_ms: int, close_after: bool) -> None:
    """`pending`'s answer is `frame`: out in its turn, optionally held back, optionally the last."""
    if close_after:
        # Nothing after a failed authentication is read (a broker closes the connection).
        core.pause(Pause.CLOSING)
        core.draining = True
    if delay_ms > 0:
        core.hold_back(pending, frame, delay_ms)
        return
    pending.response = frame
    core.flush()


def legacy_token(core: Answering, frame: memoryview, out: list[bytes | memoryview]) -> None:
    """A bare SASL token after SaslHandshake v0: no Kafka header, no correlation id."""
    header = RequestHeader(SASL_AUTHENTICATE, 0, -1, None, 4, None)
    info = core.info
    ctx = RequestContext(header, frame, info, times=Times(core.stamp()), raw=True)
    sasl = core.host.sasl_stage
    assert sasl is not None
    if isinstance(sasl, SaslTerminate):
        token, code, _, delay = sasl.step(info, bytes(frame[4:]))
        if code:
            # v0 has no error frame: the broker just closes the connection.
            fill(core, core.order.local(ctx), b"", delay, close_after=True)
            return
        state = info.sasl
        assert state is not None
        if state.server is None:
            state.legacy = False
        fill(core, core.order.local(ctx), size_prefixed(token), 0, close_after=False)
        return
    sasl.legacy_token(info, bytes(frame[4:]))
    core.order.forwarded(ctx)
    ctx.times.sent = core.stamp()
    out.append(frame)
