"""What both SASL stages share: the principal bound to a connection (after Kafka's
sasl.kerberos.principal.to.local.rules) and the connection's SASL state."""

from __future__ import annotations

import logging

from kafka_quota_proxy.config.identity_settings import SaslSettings
from kafka_quota_proxy.identity.kerberos_rules import (
    KerberosShortNamer,
    MalformedKerberosName,
    NoMatchingRule,
)
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext, SaslState

log = logging.getLogger("kafka_quota_proxy.sasl")

class Spoofing(ProtocolError):
    """A connection re-authenticated as a different principal."""

    kind = "sasl_spoofing"


class UnmappedPrincipal(ProtocolError):
    """A SASL name that sasl.kerberos.principal.to.local.rules cannot map: Kafka fails the
    authentication."""

    kind = "sasl_unmapped_principal"


class Principals:
    """Kafka's sasl.kerberos.principal.to.local.rules, applied to SASL user names."""

    def __init__(self, settings: SaslSettings) -> None:
        rules = list(settings.kerberos_rules)
        self.namer = KerberosShortNamer.parse(rules) if rules else None

    def bind(self, conn: ConnectionInfo, name: str) -> None:
        """Bind the principal a SASL name maps to."""
        try:
            principal = self.namer.short_name(name) if self.namer is not None else name
        except (NoMatchingRule, MalformedKerberosName) as exc:
            raise UnmappedPrincipal(f"no principal for SASL name {name!r}: {exc}") from None
        self.bind_principal(conn, principal)

    def bind_principal(self, conn: ConnectionInfo, principal: str, via: str = "") -> None:
        """Bind a principal as it is, not mapped (a delegation token's owner is the broker's
        principal already); `via` says how, in the log."""
        state = conn.sasl
        assert state is not None
        if state.authenticated and conn.principal != principal:
            raise Spoofing(f"re-authentication as {principal!r}, connection was {conn.principal!r}")
        state.authenticated = True
        conn.principal = principal
        log.info("connection from %s authenticated as %s%s", conn.peer, principal, via)


def sasl_state(ctx: RequestContext) -> SaslState:
    if ctx.conn.sasl is None:
        ctx.conn.sasl = SaslState()
    return ctx.conn.sasl


