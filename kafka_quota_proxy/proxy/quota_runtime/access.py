"""Who may manage quotas through the proxy: Kafka's cluster ACLs for them, as two lists.

On a Kafka broker with an authorizer, AlterClientQuotas needs ALTER_CONFIGS on the cluster and
DescribeClientQuotas needs DESCRIBE_CONFIGS, which ALTER_CONFIGS implies. Here
`quota.alter_principals` holds the principals with the first, and `quota.describe_principals`
adds principals with only the second; `*` stands for every principal. Nobody else may, with one
exception kept so that a laptop trial and `make demo` work: until `quota.alter_principals` is
set, and while no listener authenticates clients (no SASL, no client certificates), an ANONYMOUS
caller from a loopback address may (`quota.anonymous_loopback`, on by default). Once clients
authenticate, ANONYMOUS is nobody's identity in particular and gets nothing; once the operator
names who may, exactly those may.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kafka_quota_proxy.config import Settings
from kafka_quota_proxy.config.identity_settings import client_address
from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.identity import ANONYMOUS

ANYONE = "*"
UPGRADE_NOTE = ("quota management through the proxy is closed unless quota.alter_principals says "
                "who may change quotas (and quota.describe_principals who may read them); set "
                "quota.alter_principals to your admin principals, or to [\"*\"] for the old open "
                "behaviour (docs/quotas.md, \"Who may change quotas\")")

log = logging.getLogger("kafka_quota_proxy.quotas")


def authenticates_clients(settings: Settings) -> bool:
    """Whether some client may prove who it is: SASL of any mode, or client certificates."""
    return settings.sasl.mode != "none" or (
        settings.tls is not None and settings.tls.client_auth != "none")


def is_loopback(ip: str) -> bool:
    address = client_address(ip)
    return address is not None and address.is_loopback


def open_to_everyone(settings: QuotaSettings) -> list[str]:
    """The settings that let every principal manage quotas (for the warning when clients
    authenticate)."""
    found = []
    if settings.alter_principals is not None and ANYONE in settings.alter_principals:
        found.append("quota.alter_principals")
    if ANYONE in settings.describe_principals:
        found.append("quota.describe_principals")
    return found


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str  # why: for the audit line and, when refused, the error message


class QuotaAccess:
    """Decides, per request, whether its principal may alter or describe quotas."""

    def __init__(self, authenticated: bool) -> None:
        self.authenticated = authenticated  # some listener authenticates clients (fixed at start)
        self._upgrade_noted = False

    def may_alter(self, settings: QuotaSettings, principal: str, ip: str) -> Verdict:
        allowed = settings.alter_principals or frozenset()
        if principal in allowed or ANYONE in allowed:
            return Verdict(True, "in quota.alter_principals")
        if self._local_anonymous(settings, principal, ip):
            return Verdict(True, "ANONYMOUS from loopback, no client authentication configured")
        return Verdict(False, f"Principal {principal} may not alter client quotas: it is not in "
                              f"quota.alter_principals{self._why_not_loopback(settings, principal, ip)}")

    def may_describe(self, settings: QuotaSettings, principal: str, ip: str) -> Verdict:
        allowed = settings.describe_principals | (settings.alter_principals or frozenset())
        if principal in allowed or ANYONE in allowed:
            return Verdict(True, "in quota.describe_principals or quota.alter_principals")
        if self._local_anonymous(settings, principal, ip):
            return Verdict(True, "ANONYMOUS from loopback, no client authentication configured")
        return Verdict(False, f"Principal {principal} may not describe client quotas: it is not in "
                              f"quota.describe_principals or quota.alter_principals"
                              f"{self._why_not_loopback(settings, principal, ip)}")

    def note_refusal(self, settings: QuotaSettings) -> None:
        """After a refusal, once a process, when the operator never said who may manage quotas:
        what to set."""
        if settings.alter_principals is None and not self._upgrade_noted:
            self._upgrade_noted = True
            log.warning("a quota request was refused: %s", UPGRADE_NOTE)

    def _local_anonymous(self, settings: QuotaSettings, principal: str, ip: str) -> bool:
        return (principal == ANONYMOUS and settings.anonymous_loopback and settings.alter_principals is None
                and not self.authenticated and is_loopback(ip))

    def _why_not_loopback(self, settings: QuotaSettings, principal: str, ip: str) -> str:
        if principal != ANONYMOUS or not settings.anonymous_loopback or settings.alter_principals is not None:
            return ""
        if self.authenticated:
            return " (ANONYMOUS gets nothing once clients authenticate)"
        return " (ANONYMOUS may only from a loopback address)"


def management_policy(settings: Settings) -> tuple[str, list[str]]:
    """One line saying who may manage quotas, and the warnings the settings deserve (printed by
    check-config, logged at start)."""
    q = settings.quota
    authenticated = authenticates_clients(settings)

    def who(principals: frozenset[str]) -> str:
        return "everyone" if ANYONE in principals else ", ".join(sorted(principals)) or "nobody"

    alter = q.alter_principals or frozenset()
    line = f"quota management: alter by {who(alter)}; describe by {who(q.describe_principals | alter)}"
    if q.anonymous_loopback and q.alter_principals is None and not authenticated:
        line += "; and ANONYMOUS from loopback (no client authentication configured)"
    warnings = []
    if authenticated:
        for setting in open_to_everyone(q):
            warnings.append(f"{setting} is [\"*\"] while clients authenticate: every client, "
                            f"tenants included, may {'change' if 'alter' in setting else 'read'} "
                            f"every quota; name the admin principals instead")
    return line, warnings
