"""Requests the proxy answers itself: a request stage's Reply (computed at once, or later off the
event loop), and the bare SASL tokens that follow a legacy SaslHandshake v0. Each answer keeps
its place in the connection's response order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter
from typing import Any

from kafka_quota_proxy.protocol.api_keys import SASL_AUTHENTICATE
from kafka_quota_proxy.protocol.headers import RequestHeader, frame_response, size_prefixed
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.datapath.answers import ResponseQueue
from kafka_quota_proxy.proxy.datapath.host import ConnectionHost
from kafka_quota_proxy.proxy.datapath.read_gate import Pause, ReadGate
from kafka_quota_proxy.proxy.datapath.responses import Pending
from kafka_quota_proxy.proxy.stages.base import Reply
from kafka_quota_proxy.proxy.stages.sasl_terminate import SaslTerminate


class LocalAnswers:
    """ClientConnection's answers of its own; the state it shares is declared here."""

    proxy: ConnectionHost
    info: ConnectionInfo
    gate: ReadGate | None
    _order: ResponseQueue
    _draining: bool

    def _flush(self) -> None:
        raise NotImplementedError

    def _await(self, reason: Pause, future: asyncio.Future[Any], then: Callable[[], None]) -> None:
        raise NotImplementedError

    def throttle(self, ctx: RequestContext, pending: Pending | None) -> None:
        raise NotImplementedError

    def _answer_locally(self, ctx: RequestContext, reply: Reply) -> None:
        later = reply.later
        if later is not None:
            # Hold this place in the response order until the answer is computed.
            pending = self._order.local(ctx)

            def answered() -> None:
                answer = later.result()
                assert answer.body is not None
                self._fill(pending, self._frame_reply(ctx, answer.body), answer.delay_ms,
                           answer.close_after)
            self._await(Pause.AUTHENTICATING, later, answered)
            return
        if reply.body is None:
            if ctx.throttle_ms:
                self.throttle(ctx, None)  # refused with no response to send (acks=0)
            return
        self._reply(ctx, self._frame_reply(ctx, reply.body), reply.delay_ms, reply.close_after)

    @staticmethod
    def _frame_reply(ctx: RequestContext, body: bytes) -> bytes:
        hv = ctx.header.spec.response_header_version(ctx.api_version) if ctx.header.spec else 0
        return frame_response(ctx.header.correlation_id, hv, body)

    def _reply(self, ctx: RequestContext, frame: bytes, delay_ms: int = 0, close_after: bool = False) -> None:
        """Queue a response the proxy made, in order; optionally held back, optionally the last."""
        self._fill(self._order.local(ctx), frame, delay_ms, close_after)

    def _fill(self, pending: Pending, frame: bytes, delay_ms: int, close_after: bool) -> None:
        if close_after:
            # Nothing after a failed authentication is read (a broker closes the connection).
            assert self.gate is not None
            self.gate.pause(Pause.CLOSING)
            self._draining = True

        def ready() -> None:
            pending.response = frame
            self._flush()
        if delay_ms > 0:
            self.proxy.loop.call_later(delay_ms / 1000, ready)
        else:
            ready()

    def _legacy_token(self, frame: memoryview, out: list[bytes | memoryview]) -> None:
        """A bare SASL token after SaslHandshake v0: no Kafka header, no correlation id."""
        header = RequestHeader(SASL_AUTHENTICATE, 0, -1, None, 4, None)
        ctx = RequestContext(header, frame, self.info, received_at=perf_counter(), raw=True)
        sasl = self.proxy.sasl_stage
        assert sasl is not None
        if isinstance(sasl, SaslTerminate):
            token, code, _, delay = sasl.step(self.info, bytes(frame[4:]))
            if code:
                # v0 has no error frame: the broker just closes the connection.
                self._reply(ctx, b"", delay, close_after=True)
                return
            state = self.info.sasl
            assert state is not None
            if state.server is None:
                state.legacy = False
            self._reply(ctx, size_prefixed(token))
            return
        sasl.legacy_token(self.info, bytes(frame[4:]))
        self._order.forwarded(ctx)
        ctx.sent_at = perf_counter()
        out.append(frame)
