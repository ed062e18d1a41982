"""SASL at the proxy: who the principal behind a connection is.

Passthrough (`sasl.mode: passthrough`): the broker stays the authority. The proxy reads the user
name the client claims in its own authentication bytes (PLAIN authcid, SCRAM `n=`, an
OAUTHBEARER claim) and binds it to the connection only when the broker's SaslAuthenticate
response completes the exchange with success. A claim without a successful handshake first,
a second claim within an exchange, or a re-authentication as somebody else binds nothing (the
last closes the connection).

Terminate (`sasl.mode: terminate`): the proxy authenticates clients itself (PLAIN and SCRAM, from
the credentials file); until then only ApiVersions, SaslHandshake and SaslAuthenticate are
allowed, as on a broker's SASL listener. Failures are answered with Kafka's error, counted, and
slowed down per source address; the connection is then closed, as a broker does.

Legacy SaslHandshake v0 (no SaslAuthenticate: the tokens follow as bare size-prefixed frames)
is handled in both modes by `LegacyTokens`, which the connection consults before header parsing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from kafka_quota_proxy.config.identity_settings import SaslSettings
from kafka_quota_proxy.identity.credentials import CredentialStore
from kafka_quota_proxy.identity.failures import FailureBackoff
from kafka_quota_proxy.identity.kerberos_rules import KerberosShortNamer
from kafka_quota_proxy.identity.sasl_server import SaslAuthenticationError, SaslServer, SaslStep
from kafka_quota_proxy.identity.sasl_tokens import (
    SaslTokenError,
    oauthbearer_claim,
    plain_authcid,
    scram_username,
)
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage, ResponseStage

if TYPE_CHECKING:
    from kafka_quota_proxy.proxy.context import ConnectionInfo

log = logging.getLogger("kafka_quota_proxy.sasl")

SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 17, 18, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58
# SaslAuthenticate responses that complete a successful exchange, per mechanism.
ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}


class AuthenticationRequired(ProtocolError):
    kind = "unauthenticated_request"


class Spoofing(ProtocolError):
    kind = "sasl_spoofing"


@dataclass(slots=True)
class SaslState:
    """One connection's authentication progress."""

    mechanism: str | None = None  # accepted by the broker (or the proxy)
    claimed: str | None = None  # passthrough: the user named in this exchange's first token
    rounds: int = 0
    authenticated: bool = False
    legacy: bool = False  # the handshake was v0: tokens follow as bare frames
    server: Any = None  # terminate: the SaslServer of this exchange
    pending: dict[int, str] = field(default_factory=dict)  # correlation id -> mechanism offered


def _claimed_user(mechanism: str, token: bytes, claim: str) -> str | None:
    try:
        if mechanism == "PLAIN":
            return plain_authcid(token)
        if mechanism.startswith("SCRAM-"):
            return scram_username(token)
        if mechanism == "OAUTHBEARER":
            return oauthbearer_claim(token, claim)
    except SaslTokenError as exc:
        log.info("unreadable %s token (%s): no principal claimed", mechanism, exc)
    return None


class Principals:
    """Kafka's sasl.kerberos.principal.to.local.rules, applied to SASL user names."""

    def __init__(self, settings: SaslSettings) -> None:
        rules = list(settings.kerberos_rules)
        self.namer = KerberosShortNamer.parse(rules) if rules else None

    def bind(self, conn: ConnectionInfo, name: str) -> None:
        principal = self.namer.short_name(name) if self.namer is not None else name
        state = conn.sasl
        assert state is not None
        if state.authenticated and conn.principal != principal:
            raise Spoofing(f"re-authentication as {principal!r}, connection was {conn.principal!r}")
        state.authenticated = True
        conn.principal = principal
        log.info("connection from %s authenticated as %s", conn.peer, principal)


def _state(ctx: RequestContext) -> SaslState:
    if ctx.conn.sasl is None:
        ctx.conn.sasl = SaslState()
    return ctx.conn.sasl


class SaslInspect(RequestStage, ResponseStage):
    """Passthrough: note what the client claims, bind it when the broker says yes."""

    api_keys = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})

    def __init__(self, settings: SaslSettings, principals: Principals) -> None:
        self.settings = settings
        self.principals = principals

    def on_request(self, ctx: RequestContext) -> Reply | None:
        state = _state(ctx)
        request = ctx.decode_request()
        if ctx.api_key == SASL_HANDSHAKE:
            state.pending[ctx.header.correlation_id] = request.mechanism
        elif state.mechanism is not None and state.claimed is None and state.rounds == 0:
            state.claimed = _claimed_user(state.mechanism, bytes(request.auth_bytes or b""),
                                          self.settings.oauthbearer_claim)
        return None

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | None:
        state = _state(ctx)
        response = ctx.decode_response(body)
        if ctx.api_key == SASL_HANDSHAKE:
            offered = state.pending.pop(ctx.header.correlation_id, None)
            state.claimed, state.rounds = None, 0
            state.mechanism = offered if response.error_code == 0 else None
            state.legacy = state.mechanism is not None and ctx.api_version == 0
            return None
        if response.error_code != 0 or state.mechanism is None:
            state.mechanism, state.claimed = None, None
            return None
        state.rounds += 1
        if state.rounds == ROUNDS.get(state.mechanism, 1) and state.claimed is not None:
            self.principals.bind(ctx.conn, state.claimed)
            state.mechanism, state.claimed = None, None
        return None

    def legacy_token(self, conn: ConnectionInfo, token: bytes) -> None:
        """A bare v0 token from the client (forwarded as it is)."""
        state = conn.sasl
        assert state is not None and state.mechanism is not None
        if state.rounds == 0 and state.claimed is None:
            state.claimed = _claimed_user(state.mechanism, token, self.settings.oauthbearer_claim)

    def legacy_answer(self, conn: ConnectionInfo) -> bool:
        """The broker answered a bare token; True when the exchange is complete (v0 brokers
        close the connection on failure, so an answer means success)."""
        state = conn.sasl
        assert state is not None and state.mechanism is not None
        state.rounds += 1
        if state.rounds < ROUNDS.get(state.mechanism, 1):
            return False
        if state.claimed is not None:
            self.principals.bind(conn, state.claimed)
        state.mechanism, state.claimed, state.legacy = None, None, False
        return True


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
        state = _state(ctx)
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
            self.principals.bind(conn, outcome.principal)
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
            answer.set_result(self._answer(ctx, self._settle(ctx.conn, done.result())))
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
