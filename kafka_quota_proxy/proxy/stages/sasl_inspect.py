"""Passthrough (`sasl.mode: passthrough`): the broker stays the authority. The proxy reads the user
name the client claims in its own authentication bytes (PLAIN authcid, SCRAM `n=`, an
OAUTHBEARER claim) and binds it to the connection only when the broker's SaslAuthenticate
response completes the exchange with success. A claim without a successful handshake first,
a second claim within an exchange, or a re-authentication as somebody else binds nothing (the
last closes the connection).

Legacy SaslHandshake v0 (no SaslAuthenticate: the tokens follow as bare size-prefixed frames)
is handled in both modes by the connection (datapath/client.py), which consults the stage
before header parsing.
"""

from __future__ import annotations

import logging

from kafka_quota_proxy.config.identity_settings import SaslSettings
from kafka_quota_proxy.identity.sasl_tokens import (
    SaslTokenError,
    oauthbearer_claim,
    plain_authcid,
    scram_username,
)
from kafka_quota_proxy.protocol.api_keys import SASL_AUTHENTICATE, SASL_HANDSHAKE
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage, ResponseStage
from kafka_quota_proxy.proxy.stages.sasl_principals import Principals, sasl_state

log = logging.getLogger("kafka_quota_proxy.sasl")

# SaslAuthenticate responses that complete a successful exchange, per mechanism.
ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}


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


class SaslInspect(RequestStage, ResponseStage):
    """Passthrough: note what the client claims, bind it when the broker says yes."""

    api_keys = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})

    def __init__(self, settings: SaslSettings, principals: Principals) -> None:
        self.settings = settings
        self.principals = principals

    def on_request(self, ctx: RequestContext) -> Reply | None:
        state = sasl_state(ctx)
        request = ctx.decode_request()
        if ctx.api_key == SASL_HANDSHAKE:
            state.pending[ctx.header.correlation_id] = request.mechanism
        elif state.mechanism is not None and state.claimed is None and state.rounds == 0:
            state.claimed = _claimed_user(state.mechanism, bytes(request.auth_bytes or b""),
                                          self.settings.oauthbearer_claim)
        return None

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | None:
        state = sasl_state(ctx)
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


