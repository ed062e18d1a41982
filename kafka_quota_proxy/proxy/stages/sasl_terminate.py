"""Terminate (`sasl.mode: terminate`): the proxy authenticates clients itself (PLAIN and SCRAM, from
the credentials file); until then only ApiVersions, SaslHandshake and SaslAuthenticate are
allowed, as on a broker's SASL listener. Failures are answered with Kafka's error, counted, and
slowed down per source address; the connection is then closed, as a broker does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from kafka_quota_proxy.config.identity_settings import SaslSettings
from kafka_quota_proxy.identity.credentials import CredentialStore
from kafka_quota_proxy.identity.failures import FailureBackoff
from kafka_quota_proxy.identity.sasl_server import SaslAuthenticationError, SaslServer, SaslStep
from kafka_quota_proxy.protocol.api_keys import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE
from kafka_quota_proxy.protocol.error_codes import (
    ILLEGAL_SASL_STATE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
)
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext, SaslState
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage
from kafka_quota_proxy.proxy.stages.sasl_principals import Principals, UnmappedPrincipal, sasl_state

log = logging.getLogger("kafka_quota_proxy.sasl")

class AuthenticationRequired(ProtocolError):
    """A request other than ApiVersions or SASL before the client authenticated."""

    kind = "unauthenticated_request"


class SaslTerminate(RequestStage):
    """Terminate: the proxy is the SASL server; nothing else passes until it says yes."""

    api_keys = None  # every request: the unauthenticated must be stopped

    def __init__(self, settings: SaslSettings, store: CredentialStore, principals: Principals,
                 backoff: FailureBackoff, clock: Any, on_failure: Any) -> None:
        self.settings = settings
        self.store = store
        self.principals = principals
        self.backoff = backoff
        self.clock = clock
        self.on_failure = on_failure  # (mechanism) -> None, for the metric

    def on_request(self, ctx: RequestContext) -> Reply | None:
        state = sasl_state(ctx)
        key = ctx.api_key
        if key == SASL_HANDSHAKE:
            return self._handshake(ctx, state)
        if key == SASL_AUTHENTICATE:
            request = ctx.decode_request()
            return self._authenticate(ctx, state, bytes(request.auth_bytes or b""))
        if not state.authenticated and key != API_VERSIONS:
            raise AuthenticationRequired(f"{ctx.header.spec.name if ctx.header.spec else key} "
                                         "before SASL authentication")
        return None

    def _handshake(self, ctx: RequestContext, state: SaslState) -> Reply:
        mechanism = ctx.decode_request().mechanism
        cls: Any = SaslHandshakeResponse
        offered = list(self.settings.mechanisms)
        if mechanism not in offered:
            return Reply(bytes(cls(version=ctx.api_version, error_code=UNSUPPORTED_SASL_MECHANISM,
                                   mechanisms=offered).encode(version=ctx.api_version)))
        state.mechanism = mechanism
        state.server = SaslServer(mechanism, self.store)
        state.legacy = ctx.api_version == 0
        return Reply(bytes(cls(version=ctx.api_version, error_code=0, mechanisms=offered)
                           .encode(version=ctx.api_version)))

    def step(self, conn: ConnectionInfo, token: bytes) -> tuple[bytes, int, str | None, int]:
        """One client token, answered at once: (server token, Kafka error code, error message,
        delay ms before answering). A failure's answer is delayed per source address."""
        state = conn.sasl
        assert state is not None
        if state.server is None:
            return b"", ILLEGAL_SASL_STATE, "SaslAuthenticate without a successful SaslHandshake", 0
        return self._settle(conn, _attempt(state.server, token))

    def _settle(self, conn: ConnectionInfo, outcome: SaslStep | SaslAuthenticationError,
                ) -> tuple[bytes, int, str | None, int]:
        state = conn.sasl
        assert state is not None
        if isinstance(outcome, SaslAuthenticationError):
            state.server = None
            self.on_failure(state.mechanism or "?")
            log.warning("authentication failed from %s with %s: %s", conn.peer, state.mechanism, outcome)
            delay = self.backoff.on_failure(conn.ip, self.clock())
            return b"", SASL_AUTHENTICATION_FAILED, str(outcome), delay
        if outcome.done:
            state.server = None
            self.backoff.on_success(conn.ip)
            assert outcome.principal is not None
            try:
                self.principals.bind(conn, outcome.principal)
            except UnmappedPrincipal as exc:  # Kafka fails the authentication
                self.on_failure(state.mechanism or "?")
                log.warning("authentication failed from %s with %s: %s", conn.peer, state.mechanism, exc)
                return b"", SASL_AUTHENTICATION_FAILED, "Authentication failed: no principal for this user", 0
        return outcome.server_bytes, 0, None, 0

    def _authenticate(self, ctx: RequestContext, state: SaslState, token: bytes) -> Reply:
        if state.server is None or state.mechanism != "PLAIN":
            return self._answer(ctx, self.step(ctx.conn, token))
        # PLAIN checks a salted PBKDF2 hash: ~100 ms of CPU, done on a worker thread (hashlib
        # releases the GIL) so the loop keeps serving every other connection meanwhile.
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Reply] = loop.create_future()
        work = loop.run_in_executor(None, _attempt, state.server, token)

        def finish(done: asyncio.Future[SaslStep | SaslAuthenticationError]) -> None:
            if done.cancelled():  # the loop is shutting down
                answer.cancel()
                return
            try:
                answer.set_result(self._answer(ctx, self._settle(ctx.conn, done.result())))
            except Exception as exc:  # a bug: the connection is closed, not held for ever
                answer.set_exception(exc)
        work.add_done_callback(finish)
        return Reply(b"", later=answer)

    @staticmethod
    def _answer(ctx: RequestContext, outcome: tuple[bytes, int, str | None, int]) -> Reply:
        server_bytes, code, message, delay = outcome
        cls: Any = SaslAuthenticateResponse
        msg = cls(version=ctx.api_version, error_code=code, error_message=message,
                  auth_bytes=server_bytes, session_lifetime_ms=0)
        return Reply(bytes(msg.encode(version=ctx.api_version)), delay_ms=delay, close_after=code != 0)


def _attempt(server: SaslServer, token: bytes) -> SaslStep | SaslAuthenticationError:
    try:
        return server.step(token)
    except SaslAuthenticationError as exc:
        return exc
