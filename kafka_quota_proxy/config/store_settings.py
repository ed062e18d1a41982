"""The `store:` section: the Valkey/Redis server that proxy replicas share quota state through.

Absent, every proxy process keeps its quota state to itself, as before. What is shared and how:
docs/cluster-quotas.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.validators import boolean, file_path, mapping, one_of, whole_number

ON_FAILURE = ("local_share", "open", "closed")
SCHEMES = ("redis", "rediss", "unix", "valkey", "valkeys")


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Where the shared quota state lives and how often this replica syncs with it."""

    url: str
    cluster: bool = False
    key_prefix: str = "kqp"
    sync_interval_ms: int = 100
    timeout_ms: int = 500  # connect and each sync; a sync that takes longer has failed
    # Entities are spread over this many hash-tagged buckets, one script call each. None: 1 on a
    # standalone server (one call a sync), 16 on a Cluster (calls spread over its masters).
    buckets: int | None = None
    on_failure: str = "local_share"
    degraded_grace_seconds: float = 30.0
    password_env: str | None = None  # the AUTH password from this environment variable
    tls_ca_file: str | None = None  # for rediss://; the system's CAs when unset

    @property
    def effective_buckets(self) -> int:
        if self.buckets is not None:
            return self.buckets
        return 16 if self.cluster else 1

    @property
    def redacted_url(self) -> str:
        """The url without its password, for logs and check-config."""
        return redact(self.url)

    def password(self) -> str | None:
        if self.password_env is None:
            return None
        return os.environ.get(self.password_env)


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def _url(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, "expected a url such as redis://HOST:6379 or unix:///path/to/socket")
    text = value.strip()
    parts = urlsplit(text)
    if parts.scheme not in SCHEMES:
        raise ConfigError(key, f"expected a redis://, rediss:// or unix:// url, got {redact(text)!r}")
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigError(key, "a unix:// url needs the socket's path: unix:///run/valkey.sock")
    else:
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(key, f"bad port in {redact(text)!r}") from None
        if not parts.hostname:
            raise ConfigError(key, f"no host in {redact(text)!r}")
        del port
    return text


def _seconds(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(key, f"expected a number of seconds >= 0, got {value!r}")
    return float(value)


KNOWN = ("url", "cluster", "key_prefix", "sync_interval_ms", "timeout_ms", "buckets", "on_failure",
         "degraded_grace_seconds", "password_env", "tls_ca_file")


def parse_store(raw: Any) -> StoreSettings | None:
    if raw is None:
        return None
    raw = mapping("store", raw, "a mapping with at least url: redis://HOST:PORT")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        full = f"store.{key}"
        if key == "url":
            values[key] = _url(full, value)
        elif key == "cluster":
            values[key] = boolean(full, value)
        elif key == "key_prefix":
            if not isinstance(value, str) or not value or any(c in value for c in "{} \t\n"):
                raise ConfigError(full, "expected a non-empty word without braces or spaces")
            values[key] = value
        elif key == "sync_interval_ms":
            values[key] = whole_number(full, value, minimum=10)
        elif key == "timeout_ms":
            values[key] = whole_number(full, value, minimum=10)
        elif key == "buckets":
            values[key] = None if value is None else whole_number(full, value)
        elif key == "on_failure":
            values[key] = one_of(full, value, ON_FAILURE)
        elif key == "degraded_grace_seconds":
            values[key] = _seconds(full, value)
        elif key == "password_env":
            if value is None:
                continue
            if not isinstance(value, str) or not value:
                raise ConfigError(full, "expected the name of an environment variable")
            values[key] = value
        elif key == "tls_ca_file":
            values[key] = file_path(full, value)
        else:
            raise ConfigError(full, f"unknown key (known: {', '.join(KNOWN)})")
    if "url" not in values:
        raise ConfigError("store.url", "required: the server, e.g. redis://valkey:6379")
    settings = StoreSettings(**values)
    if settings.cluster and urlsplit(settings.url).scheme == "unix":
        raise ConfigError("store.cluster", "a Valkey Cluster is reached over TCP, not a unix:// socket")
    return settings
