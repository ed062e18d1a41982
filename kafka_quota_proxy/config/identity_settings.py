"""Identity and transport security settings: TLS, SASL, principal mapping, PROXY protocol.

Every key with its default: docs/configuration.md; what they do: docs/identity.md.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.validators import file_path, mapping

SASL_MODES = ("none", "passthrough", "terminate")
CLIENT_AUTH = ("none", "requested", "required")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """TLS on the client listeners (`tls:`)."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    client_auth: str = "none"


@dataclass(frozen=True, slots=True)
class UpstreamTlsSettings:
    """TLS towards the brokers (`upstream_tls:`)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    check_hostname: bool = True


@dataclass(frozen=True, slots=True)
class SaslSettings:
    """How clients authenticate (`sasl:`): none, passthrough or terminate."""

    mode: str = "none"
    mechanisms: tuple[str, ...] = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
    credentials_file: str | None = None
    oauthbearer_claim: str = "sub"
    # Empty: SASL names are principals as sent (Kafka's behaviour outside GSSAPI).
    kerberos_rules: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UpstreamSaslSettings:
    """The proxy's own SASL credentials at the brokers (`upstream_sasl:`)."""

    mechanism: str
    username: str
    password: str = field(repr=False)  # never printed


def _check_keys(key: str, raw: dict[str, Any], known: tuple[str, ...]) -> None:
    for k in raw:
        if k not in known:
            raise ConfigError(f"{key}.{k}", f"unknown key (known: {', '.join(known)})")


def parse_tls(raw: Any) -> TlsSettings | None:
    if raw is None:
        return None
    raw = mapping("tls", raw)
    _check_keys("tls", raw, ("cert_file", "key_file", "ca_file", "client_auth"))
    client_auth = raw.get("client_auth", "none")
    if client_auth not in CLIENT_AUTH:
        raise ConfigError("tls.client_auth", f"expected one of {', '.join(CLIENT_AUTH)}, got {client_auth!r}")
    ca = file_path("tls.ca_file", raw.get("ca_file"))
    if client_auth != "none" and ca is None:
        raise ConfigError("tls.ca_file", "required to verify client certificates (client_auth is "
                          f"{client_auth})")
    return TlsSettings(file_path("tls.cert_file", raw.get("cert_file"), True) or "",
                       file_path("tls.key_file", raw.get("key_file"), True) or "", ca, client_auth)


def parse_upstream_tls(raw: Any) -> UpstreamTlsSettings | None:
    if raw is None or raw is False:
        return None
    if raw is True:
        return UpstreamTlsSettings()
    raw = mapping("upstream_tls", raw)
    _check_keys("upstream_tls", raw, ("ca_file", "cert_file", "key_file", "check_hostname"))
    check = raw.get("check_hostname", True)
    if not isinstance(check, bool):
        raise ConfigError("upstream_tls.check_hostname", "expected true or false")
    cert, key = file_path("upstream_tls.cert_file", raw.get("cert_file")), file_path("upstream_tls.key_file",
                                                                             raw.get("key_file"))
    if (cert is None) != (key is None):
        raise ConfigError("upstream_tls.key_file", "cert_file and key_file go together")
    return UpstreamTlsSettings(file_path("upstream_tls.ca_file", raw.get("ca_file")), cert, key, check)


def parse_sasl(raw: Any) -> SaslSettings:
    if raw is None:
        return SaslSettings()
    raw = mapping("sasl", raw)
    _check_keys("sasl", raw, ("mode", "mechanisms", "credentials_file", "oauthbearer_claim",
                              "kerberos_rules"))
    mode = raw.get("mode", "none")
    if mode not in SASL_MODES:
        raise ConfigError("sasl.mode", f"expected one of {', '.join(SASL_MODES)}, got {mode!r}")
    mechanisms: Any = raw.get("mechanisms", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
    if not isinstance(mechanisms, list) or not mechanisms or any(m not in MECHANISMS for m in mechanisms):
        raise ConfigError("sasl.mechanisms", f"expected a list of {', '.join(MECHANISMS)}")
    if mode == "terminate" and "OAUTHBEARER" in mechanisms:
        raise ConfigError("sasl.mechanisms", "terminate mode supports PLAIN and SCRAM-SHA-256/512; "
                          "OAUTHBEARER is passthrough only")
    credentials = file_path("sasl.credentials_file", raw.get("credentials_file"))
    if mode == "terminate" and credentials is None:
        raise ConfigError("sasl.credentials_file", "required in terminate mode "
                          "(create it with: kafka-quota-proxy users add NAME --file FILE)")
    claim = raw.get("oauthbearer_claim", "sub")
    if not isinstance(claim, str) or not claim:
        raise ConfigError("sasl.oauthbearer_claim", "expected a claim name")
    rules = raw.get("kerberos_rules", [])
    if isinstance(rules, str):
        rules = [r.strip() for r in rules.split(",") if r.strip()]
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise ConfigError("sasl.kerberos_rules", "expected a list of rules")
    try:
        from kafka_quota_proxy.identity.kerberos_rules import KerberosShortNamer

        KerberosShortNamer.parse(rules)
    except ValueError as exc:
        raise ConfigError("sasl.kerberos_rules", str(exc)) from None
    return SaslSettings(mode, tuple(mechanisms), credentials, claim, tuple(rules))


def parse_upstream_sasl(raw: Any) -> UpstreamSaslSettings | None:
    if raw is None:
        return None
    raw = mapping("upstream_sasl", raw)
    _check_keys("upstream_sasl", raw, ("mechanism", "username", "password", "password_file"))
    mechanism = raw.get("mechanism")
    if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise ConfigError("upstream_sasl.mechanism", "expected PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    username = raw.get("username")
    if not isinstance(username, str) or not username:
        raise ConfigError("upstream_sasl.username", "expected a user name")
    if ("password" in raw) == ("password_file" in raw):
        raise ConfigError("upstream_sasl.password", "set exactly one of password and password_file")
    if "password_file" in raw:
        path = file_path("upstream_sasl.password_file", raw["password_file"], True) or ""
        try:
            with open(path, encoding="utf-8") as f:
                password = f.read().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError("upstream_sasl.password_file", f"cannot read: {exc.strerror}") from None
    else:
        password = raw["password"]
        if not isinstance(password, str):
            raise ConfigError("upstream_sasl.password", "expected a string")
    return UpstreamSaslSettings(mechanism, username, password)


def parse_cidr_principals(raw: Any) -> tuple[tuple[Any, str], ...]:
    """Most specific network first, so the longest prefix wins."""
    if raw is None:
        return ()
    raw = mapping("principals_by_cidr", raw)
    out = []
    for cidr, principal in raw.items():
        try:
            net = ipaddress.ip_network(str(cidr), strict=False)
        except ValueError:
            raise ConfigError(f"principals_by_cidr.{cidr}", "not a CIDR range like 10.0.0.0/8") from None
        if not isinstance(principal, str) or not principal:
            raise ConfigError(f"principals_by_cidr.{cidr}", "expected a principal name")
        out.append((net, principal))
    out.sort(key=lambda item: item[0].prefixlen, reverse=True)
    return tuple(out)


def parse_ssl_rules(raw: Any) -> str:
    if raw is None:
        return "DEFAULT"
    if isinstance(raw, list):
        raw = ",".join(raw)
    if not isinstance(raw, str):
        raise ConfigError("ssl_principal_mapping_rules", "expected rules text or a list of rules")
    try:
        from kafka_quota_proxy.identity.ssl_rules import SslPrincipalMapper

        SslPrincipalMapper.from_rules(raw)
    except ValueError as exc:
        raise ConfigError("ssl_principal_mapping_rules", str(exc)) from None
    return raw


def client_address(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A client's address as the rules see it (an IPv4-mapped IPv6 address as IPv4), or None if
    `ip` is not an address."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def principal_for_address(ip: str, table: tuple[tuple[Any, str], ...]) -> str | None:
    if not table:
        return None
    addr = client_address(ip)
    if addr is None:
        return None
    for net, principal in table:
        if addr.version == net.version and addr in net:
            return principal
    return None
