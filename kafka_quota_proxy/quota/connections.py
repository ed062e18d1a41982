"""Kafka's per-IP connection creation rate (KIP-612), clock injected: `ConnectionQuotas`."""

from __future__ import annotations

import ipaddress
from typing import cast

from kafka_quota_proxy.quota.entities import DEFAULT, QuotaKey
from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.sensors import Sensors
from kafka_quota_proxy.quota.throttle import rate_throttle_time_ms

# QuotaConfig.IP_CONNECTION_RATE_DEFAULT: an IP limit of Int.MAX_VALUE means "not enforced".
IP_CONNECTION_RATE_DEFAULT = 2**31 - 1


def normalize_ip(name: str) -> str:
    """An address's canonical text, so `::ffff:10.0.0.1` and `10.0.0.1` are one entity, as Java's
    InetAddress makes them. Host names are kept as given (resolving them is I/O)."""
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return name
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def _java_int(value: float) -> int:
    # Kafka reads the limit as an Int: (int) of a double truncates and saturates.
    if value != value:
        return 0
    if value >= IP_CONNECTION_RATE_DEFAULT:
        return IP_CONNECTION_RATE_DEFAULT
    if value <= -(2**31):
        return -(2**31)
    return int(value)


class ConnectionQuotas:
    """Per-IP `connection_creation_rate` (KIP-612): an IP's own limit, else the `<default>` IP's.

    A connection over the limit is not counted and is closed, without reading, after the throttle
    time, min((O - T)/T * window, W) ms. A limit of 0 throttles every connection for W ms.
    """

    def __init__(self, store: QuotaStore, config: MetricConfig, sensors: Sensors,
                 max_cached: int = 100_000) -> None:
        self.store = store
        self.config = config
        self.sensors = sensors
        self.max_throttle_ms = config.window_ms
        self.max_cached = max_cached
        self._new_rate = lambda: Rate(config)
        self._version = -1
        self._limits: dict[str, int] = {}
        self._default: int = IP_CONNECTION_RATE_DEFAULT
        self._cache: dict[str, tuple[str, int]] = {}  # ip as given -> (normalized, limit)

    def _refresh(self) -> None:
        if self.store.version == self._version:
            return
        limits: dict[str, int] = {}
        default = IP_CONNECTION_RATE_DEFAULT
        for entity, value in self.store.items_for(QuotaKey.CONNECTION_CREATION_RATE):
            if entity.ip is None:
                continue
            if entity.ip == DEFAULT:
                default = _java_int(value)
            else:
                limits[normalize_ip(entity.ip)] = _java_int(value)
        self._limits = limits
        self._default = default
        self._cache = {}
        self._version = self.store.version

    def _lookup(self, ip: str) -> tuple[str, int]:
        self._refresh()
        hit = self._cache.get(ip)
        if hit is None:
            norm = normalize_ip(ip)
            hit = (norm, self._limits.get(norm, self._default))
            if len(self._cache) >= self.max_cached:
                self._cache = {}
            self._cache[ip] = hit
        return hit

    def connection_rate_for_ip(self, ip: str) -> int | None:
        """The enforced limit for `ip`, None when not enforced (no quota, or Int.MAX_VALUE)."""
        limit = self._lookup(ip)[1]
        return None if limit == IP_CONNECTION_RATE_DEFAULT else limit

    def on_accept(self, ip: str, now_ms: float) -> int:
        """Count a new connection from `ip`: 0 to keep it, or the delay in ms after which to close
        it unread (it is then not counted)."""
        norm, limit = self._lookup(ip)
        if limit == IP_CONNECTION_RATE_DEFAULT:
            return 0
        rate = self.sensors.get_or_create(("ip", norm), now_ms, self._new_rate)
        if rate is None:
            return 0  # entity cap reached: not measured, so accepted (counted in `dropped`)
        rate.record(1.0, now_ms)
        measured = rate.measure(now_ms)
        if measured > limit:
            throttle = rate_throttle_time_ms(rate, measured, limit, now_ms, self.max_throttle_ms)
            if throttle > 0:
                rate.record(-1.0, now_ms)  # the connection is refused, so it does not count
                return throttle
        return 0

    def measure(self, ip: str, now_ms: float) -> float:
        """The current connection creation rate of `ip` (0.0 if not measured)."""
        stat = self.sensors.get(("ip", self._lookup(ip)[0]), now_ms)
        return 0.0 if stat is None else cast(Rate, stat).measure(now_ms)
