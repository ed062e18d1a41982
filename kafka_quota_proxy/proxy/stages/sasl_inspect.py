"""Passthrough (`sasl.mode: passthrough`): the broker stays the authority. The proxy reads the user
name the client claims in its own authentication bytes (PLAIN authcid, SCRAM `n=`, an
OAUTHBEARER claim) and binds it to the connection only when the broker's SaslAuthenticate
response completes the exchange with success. A claim without a successful handshake first,
a second claim within an exchange, or a re-authentication as somebody else binds nothing (the
last closes the connection).

A SCRAM login with a delegation token (`tokenauth=true`) names the token's id, and Kafka's
principal is then the token's owner (identity/delegation_tokens.py): the connection is bound to
the owner. If the proxy does not know it yet, it asks the broker once the broker has accepted
the token's id (the first SCRAM round), and the exchange's last response waits for the answer
(`RequestContext.hold`). If no answer names the owner, the connection is identified by the token
id instead, which is logged once per token id (docs/identity.md).

Legacy SaslHandshake v0 (no SaslAuthenticate: the tokens follow as bare size-prefixed frames)
is handled in both modes by the connection (datapath/client.py), which consults the stage
before header parsing.
"""

from __future__ import annotations

import asyncio
import logging

from kafka_quota_proxy.config.identity_settings import SaslSettings
from kafka_quota_proxy.identity.sasl_tokens import (
    SaslTokenError,
    oauthbearer_claim,
    parse_scram_client_first,
    plain_authcid,
)
from kafka_quota_proxy.protocol.api_keys import SASL_AUTHENTICATE, SASL_HANDSHAKE
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext, SaslState
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage, ResponseStage
from kafka_quota_proxy.proxy.stages.sasl_principals import Principals, sasl_state
from kafka_quota_proxy.proxy.token_owners import TokenOwnerLookup

log = logging.getLogger("kafka_quota_proxy.sasl")

# SaslAuthenticate responses that complete a successful exchange, per mechanism.
ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}


def _claimed_user(mechanism: str, token: bytes, claim: str) -> tuple[str | None, bool]:
    """The name claimed, and whether it is a delegation token's id."""
    try:
        if mechanism == "PLAIN":
            return plain_authcid(token), False
        if mechanism.startswith("SCRAM-"):
            first = parse_scram_client_first(token)
            return first.username, first.delegation_token
        if mechanism == "OAUTHBEARER":
            return oauthbearer_claim(token, claim), False
    except SaslTokenError as exc:
        log.info("unreadable %s token (%s): no principal claimed", mechanism, exc)
    return None, False


class SaslInspect(RequestStage, ResponseStage):
    """Passthrough: note what the client claims, bind it when the broker says yes."""

    api_keys = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})

    def __init__(self, settings: SaslSettings, principals: Principals,
                 tokens: TokenOwnerLookup | None = None) -> None:
        self.settings = settings
        self.principals = principals
        self.tokens = tokens  # delegation tokens' owners; None: a token client is its token id

    def on_request(self, ctx: RequestContext) -> Reply | None:
        state = sasl_state(ctx)
        request = ctx.decode_request()
        if ctx.api_key == SASL_HANDSHAKE:
            state.pending[ctx.header.correlation_id] = request.mechanism
        elif state.mechanism is not None and state.claimed is None and state.rounds == 0:
            self._claim(state, bytes(request.auth_bytes or b""))
        return None

    def _claim(self, state: SaslState, token: bytes) -> None:
        assert state.mechanism is not None
        state.claimed, state.claimed_token = _claimed_user(state.mechanism, token,
                                                           self.settings.oauthbearer_claim)

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | None:
        state = sasl_state(ctx)
        response = ctx.decode_response(body)
        if ctx.api_key == SASL_HANDSHAKE:
            offered = state.pending.pop(ctx.header.correlation_id, None)
            state.claimed, state.claimed_token, state.rounds = None, False, 0
            state.mechanism = offered if response.error_code == 0 else None
            state.legacy = state.mechanism is not None and ctx.api_version == 0
            return None
        if response.error_code != 0 or state.mechanism is None:
            state.mechanism, state.claimed, state.claimed_token = None, None, False
            return None
        self._answered(ctx, state)
        return None

    def _answered(self, ctx: RequestContext, state: SaslState) -> None:
        """The broker answered a round with success."""
        assert state.mechanism is not None
        state.rounds += 1
        if state.claimed is None:
            return
        if state.rounds < ROUNDS.get(state.mechanism, 1):
            if state.claimed_token and self.tokens is not None and self.tokens.known(state.claimed) is None:
                # The broker knows the token's id (Kafka fails the first SCRAM round otherwise):
                # start asking for its owner while the exchange goes on.
                self.tokens.find(state.claimed)
            return
        if state.claimed_token:
            self._bind_token(ctx, state.claimed)
        else:
            self.principals.bind(ctx.conn, state.claimed)
            state.token_id = None
        state.mechanism, state.claimed, state.claimed_token = None, None, False

    def _bind_token(self, ctx: RequestContext, token_id: str) -> None:
        """Bind the token's owner, now or once the broker has said who it is (`ctx.hold`)."""
        conn, tokens = ctx.conn, self.tokens
        owner = tokens.known(token_id) if tokens is not None else None
        found = tokens.find(token_id) if tokens is not None and owner is None else None
        if found is None or found.done():
            if found is not None and not found.cancelled():
                owner = found.result()
            self._bind_owner(conn, token_id, owner)
            return
        hold: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def answered(found: asyncio.Future[str | None]) -> None:
            try:
                self._bind_owner(conn, token_id, None if found.cancelled() else found.result())
            except Exception as exc:  # ProtocolError: spoofing, say; the connection is closed
                hold.set_exception(exc)
            else:
                hold.set_result(None)
        found.add_done_callback(answered)
        ctx.hold = hold

    def _bind_owner(self, conn: ConnectionInfo, token_id: str, owner: str | None) -> None:
        state = conn.sasl
        assert state is not None
        via = f" (the owner of delegation token {token_id})"
        if owner is None:
            if state.authenticated and state.token_id == token_id:
                return  # the same token again: the connection stays who it was
            if self.tokens is None or self.tokens.owners.first_fallback(token_id):
                why = self.tokens.why_unknown(token_id) if self.tokens is not None else "not asked for"
                log.warning("delegation token %s: its owner is unknown (%s); its clients are "
                            "identified by the token id, not by their owner as Kafka identifies "
                            "them, until the proxy learns the owner", token_id, why)
            owner, via = token_id, " (delegation token, owner unknown)"
        elif state.authenticated and state.token_id == token_id and conn.principal == token_id:
            state.authenticated = False  # identified by the token id so far: now by its owner
        self.principals.bind_principal(conn, owner, via)
        state.token_id = token_id

    def legacy_token(self, conn: ConnectionInfo, token: bytes) -> None:
        """A bare v0 token from the client (forwarded as it is)."""
        state = conn.sasl
        assert state is not None and state.mechanism is not None
        if state.rounds == 0 and state.claimed is None:
            self._claim(state, token)

    def legacy_answer(self, ctx: RequestContext) -> bool:
        """The broker answered a bare token; True when the exchange is complete (v0 brokers
        close the connection on failure, so an answer means success)."""
        state = ctx.conn.sasl
        assert state is not None and state.mechanism is not None
        done = state.rounds + 1 >= ROUNDS.get(state.mechanism, 1)
        self._answered(ctx, state)
        if not done:
            return False
        state.mechanism, state.claimed, state.claimed_token, state.legacy = None, None, False, False
        return True
