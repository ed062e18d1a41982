"""The proxy's settings: defaults, then a YAML file, then command-line flags (flags win).

Every key of the YAML file is listed in `KEYS`; an unknown key is an error rather than a silent
no-op, because a misspelt setting that is ignored is worse than a refusal to start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.identity_settings import (
    SaslSettings,
    TlsSettings,
    UpstreamSaslSettings,
    UpstreamTlsSettings,
    parse_cidr_principals,
    parse_sasl,
    parse_ssl_rules,
    parse_tls,
    parse_upstream_sasl,
    parse_upstream_tls,
)
from kafka_quota_proxy.config.loading import load_document
from kafka_quota_proxy.config.quota_settings import (
    QuotaEntry,
    QuotaSettings,
    parse_quota_list,
    parse_quota_section,
    validate_quota_entries,
)
from kafka_quota_proxy.config.store_settings import StoreSettings, parse_store
from kafka_quota_proxy.config.usage_settings import UsageLogSettings, parse_usage_log
from kafka_quota_proxy.config.validators import boolean, mapping, one_of, whole_number
from kafka_quota_proxy.config.worker_settings import WorkerRole, parse_workers
from kafka_quota_proxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Kafka's connections.max.idle.ms on a broker: a client connection with no byte read or written
# for this long is closed.
DEFAULT_CONNECTIONS_MAX_IDLE_MS = 600_000


@dataclass(frozen=True, slots=True)
class HostPort:
    """A host and port, printed with brackets around an IPv6 host."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the proxy needs to run. Built by `merge`; never mutated afterwards."""

    upstream: tuple[HostPort, ...]
    listen: HostPort = HostPort("0.0.0.0", 9092)
    advertised_host: str | None = None
    node_port_base: int | None = None
    node_ports: Mapping[int, int] = field(default_factory=dict)
    metrics: HostPort | None = None
    log_level: str = "INFO"
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    metadata_refresh_seconds: float = 30.0
    connect_timeout_seconds: float = 10.0
    shutdown_timeout_seconds: float = 30.0
    max_inflight_requests: int = 5  # per client connection, forwarded and not yet answered
    connections_max_idle_ms: int | None = DEFAULT_CONNECTIONS_MAX_IDLE_MS  # None: never
    splice: bool = True  # large Fetch responses moved by splice(2) where both sides are plain TCP
    quota: QuotaSettings = QuotaSettings()
    quotas: tuple[QuotaEntry, ...] = ()
    config_path: str | None = None  # the YAML file these came from, watched for quota changes
    tls: TlsSettings | None = None
    upstream_tls: UpstreamTlsSettings | None = None
    sasl: SaslSettings = SaslSettings()
    upstream_sasl: UpstreamSaslSettings | None = None
    ssl_principal_mapping_rules: str = "DEFAULT"
    principals_by_cidr: tuple[tuple[Any, str], ...] = ()
    proxy_protocol: bool = False
    proxy_protocol_timeout_seconds: float = 10.0  # a connection must send its header by then
    usage_log: UsageLogSettings | None = None  # the per-tenant usage log; off when None
    store: StoreSettings | None = None  # quota state shared with other replicas; local when None
    workers: int = 1  # worker processes on this host; more than one starts a supervisor
    worker: WorkerRole | None = None  # set only in a worker a supervisor started (internal)

    @property
    def effective_advertised_host(self) -> str:
        """What clients are told: the flag, else the listen host unless it is a wildcard."""
        if self.advertised_host:
            return self.advertised_host
        if self.listen.host in ("0.0.0.0", "::", ""):
            return "localhost"
        return self.listen.host

    @property
    def effective_node_port_base(self) -> int:
        return self.node_port_base if self.node_port_base is not None else self.listen.port + 1

    def node_port(self, node_id: int) -> int:
        """The proxy port for a broker: a pinned port, else node_port_base + node_id."""
        pinned = self.node_ports.get(node_id)
        if pinned is not None:
            return pinned
        return self.effective_node_port_base + node_id


def parse_host_port(key: str, value: Any) -> HostPort:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, f"expected HOST:PORT, got {value!r}")
    text = value.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
    else:
        host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(key, f"expected HOST:PORT, got {value!r}")
    return HostPort(host, _port(key, port_text))


def _port(key: str, value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"port must be a whole number, got {value!r}")
    port = value
    if not 1 <= port <= 65535:
        raise ConfigError(key, f"port must be in 1..65535, got {value!r}")
    return port


def _upstream(key: str, value: Any) -> tuple[HostPort, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ConfigError(key, "expected one or more HOST:PORT (a list, or comma-separated)")
    return tuple(parse_host_port(key, item) for item in items)


def _positive_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(key, f"expected a positive number of seconds, got {value!r}")
    return float(value)


def _host(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise ConfigError(key, f"expected a host name or address, got {value!r}")
    return value.strip()


def _log_level(key: str, value: Any) -> str:
    one_of(key, str(value).upper(), LOG_LEVELS)
    return str(value).upper()


def _node_ports(key: str, value: Any) -> dict[int, int]:
    value = mapping(key, value, "a mapping of broker node id to proxy port")
    out: dict[int, int] = {}
    for node, port in value.items():
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise ConfigError(f"{key}.{node}", "node ids must be whole numbers >= 0")
        out[node] = _port(f"{key}.{node}", port)
    return out




def _max_idle_ms(key: str, value: Any) -> int | None:
    """Milliseconds, at least 1; -1 (Kafka's word for never) or null: no idle timeout. Not 0,
    which Kafka would take as "close every connection at once"."""
    if value is None or (value == -1 and not isinstance(value, bool)):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, f"expected milliseconds (a whole number >= 1), or -1 or null for no "
                               f"idle timeout, got {value!r}")
    return value


def _metrics(key: str, value: Any) -> HostPort | None:
    return None if value in (None, "", False) else parse_host_port(key, value)


# YAML key -> (Settings field, parser)
KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "upstream": ("upstream", _upstream),
    "listen": ("listen", parse_host_port),
    "advertised_host": ("advertised_host", _host),
    "node_port_base": ("node_port_base", lambda k, v: _port(k, v)),
    "node_ports": ("node_ports", _node_ports),
    "metrics": ("metrics", _metrics),
    "log_level": ("log_level", _log_level),
    "max_frame_bytes": ("max_frame_bytes", whole_number),
    "metadata_refresh_seconds": ("metadata_refresh_seconds", _positive_float),
    "connect_timeout_seconds": ("connect_timeout_seconds", _positive_float),
    "shutdown_timeout_seconds": ("shutdown_timeout_seconds", _positive_float),
    "max_inflight_requests": ("max_inflight_requests", whole_number),
    "connections_max_idle_ms": ("connections_max_idle_ms", _max_idle_ms),
    "splice": ("splice", boolean),
    "quota": ("quota", lambda k, v: parse_quota_section(v)),
    "quotas": ("quotas", lambda k, v: tuple(parse_quota_list(v))),
    "tls": ("tls", lambda k, v: parse_tls(v)),
    "upstream_tls": ("upstream_tls", lambda k, v: parse_upstream_tls(v)),
    "sasl": ("sasl", lambda k, v: parse_sasl(v)),
    "upstream_sasl": ("upstream_sasl", lambda k, v: parse_upstream_sasl(v)),
    "ssl_principal_mapping_rules": ("ssl_principal_mapping_rules", lambda k, v: parse_ssl_rules(v)),
    "principals_by_cidr": ("principals_by_cidr", lambda k, v: parse_cidr_principals(v)),
    "proxy_protocol": ("proxy_protocol", boolean),
    "proxy_protocol_timeout_seconds": ("proxy_protocol_timeout_seconds", _positive_float),
    "usage_log": ("usage_log", lambda k, v: parse_usage_log(v)),
    "store": ("store", lambda k, v: parse_store(v)),
    "workers": ("workers", parse_workers),
}


def parse_values(raw: Mapping[str, Any], source: str | None = None) -> dict[str, Any]:
    """Validate a mapping of config keys; return Settings field values."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in KEYS:
            known = ", ".join(sorted(KEYS))
            raise ConfigError(str(key), f"unknown key (known keys: {known})", source)
        name, parser = KEYS[key]
        try:
            values[name] = parser(key, value)
        except ConfigError as exc:
            raise ConfigError(exc.key, exc.message, source) from None
    return values


def load_file(path: str | Path) -> dict[str, Any]:
    """Read and validate a YAML config file; return Settings field values."""
    source = str(path)
    raw = load_document(path, "config")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("config", "the top level must be a mapping of keys to values", source)
    values = parse_values(raw, source)
    validate_quota_entries(values.get("quotas", ()), source)
    values["config_path"] = source
    return values


def merge(*layers: Mapping[str, Any]) -> Settings:
    """Later layers override earlier ones. `upstream` must be set by some layer."""
    values: dict[str, Any] = {}
    for layer in layers:
        values.update(layer)
    if "upstream" not in values:
        raise ConfigError("upstream", "required: the broker(s) to proxy, as HOST:PORT[,HOST:PORT...]")
    settings = Settings(**values)
    _check_ports(settings)
    return settings


def _check_ports(settings: Settings) -> None:
    if settings.node_port_base is not None and settings.node_port_base == settings.listen.port:
        raise ConfigError("node_port_base", "must differ from the listen port")
    for node, port in settings.node_ports.items():
        if port == settings.listen.port:
            raise ConfigError(f"node_ports.{node}", "must differ from the listen port")
    if settings.metrics and settings.metrics.port == settings.listen.port:
        raise ConfigError("metrics", "must differ from the listen port")
