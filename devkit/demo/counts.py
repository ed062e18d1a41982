"""The demo's numbers: what the sample clients did, what librdkafka said about throttling, and
one reading of the proxy's own Prometheus metrics, with rates over a short sliding window.

Nothing here touches the network or starts anything; devkit.demo.view shows these numbers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from kafka_quota_proxy.proxy.observability.metrics import METRIC_PREFIX

RATE_WINDOW_SECONDS = 2.0
# Throttles come one or a few at a time, each holding a client for a second or more: count them
# over a longer window than the rates.
THROTTLE_WINDOW_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class ClientCounts:
    """What one sample client has done so far."""

    records: int = 0
    bytes: int = 0
    errors: int = 0


@dataclass(frozen=True, slots=True)
class Throttle:
    """librdkafka's own view of broker throttling over its last statistics interval (the
    `brokers[*].throttle` window of its stats, in ms), across the brokers it talks to."""

    max: float = 0.0
    avg: float = 0.0
    count: int = 0


@dataclass(frozen=True, slots=True)
class ProducerView:
    """One sample producer, as shown: its client-id, its quota, what it did, what it was told."""

    client_id: str
    key: str  # the prefix of its counters in `Rates`
    quota: float | None  # producer_byte_rate configured for it (None: no quota)
    counts: ClientCounts
    librdkafka: Throttle  # over its last statistics intervals (THROTTLE_WINDOW_SECONDS)
    librdkafka_max_seen: float  # the largest throttle librdkafka has reported so far
    note: str  # how it produces


@dataclass(slots=True)
class ApiCounts:
    """The proxy's counters for one Kafka API: requests, bytes each way, upstream latency."""

    requests: float = 0.0
    bytes_in: float = 0.0  # client -> proxy (request bytes)
    bytes_out: float = 0.0  # proxy -> client (response bytes)
    latency_sum: float = 0.0
    latency_count: float = 0.0
    buckets: list[tuple[float, float]] = field(default_factory=list)  # (le, cumulative count)

    def quantile(self, q: float) -> float | None:
        """Estimate a latency quantile from the histogram buckets, as PromQL's
        histogram_quantile does: linear interpolation inside the bucket holding the rank."""
        if not self.latency_count or not self.buckets:
            return None
        rank = q * self.latency_count
        lower, below = 0.0, 0.0
        for le, cumulative in sorted(self.buckets):
            if cumulative >= rank:
                if math.isinf(le):
                    return lower  # beyond the largest finite bucket: report its bound
                inside = cumulative - below
                return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = le, cumulative
        return lower

    @property
    def mean_latency(self) -> float | None:
        return self.latency_sum / self.latency_count if self.latency_count else None


@dataclass(slots=True)
class QuotaCounts:
    """The proxy's quota metrics for one client-id (summed over scopes and users)."""

    byte_rate: float | None = None  # producer_byte_rate as the proxy measures it (bytes/s)
    limit: float | None = None  # the producer_byte_rate quota in force for it
    throttle_ms: float = 0.0  # total throttle the proxy applied, every quota type
    throttled: float = 0.0  # responses throttled


@dataclass(slots=True)
class ProxyCounts:
    """One reading of the proxy's Prometheus registry."""

    apis: dict[str, ApiCounts] = field(default_factory=dict)
    quotas: dict[str, QuotaCounts] = field(default_factory=dict)  # by client-id
    connections_open: float = 0.0
    connections_accepted: float = 0.0
    protocol_errors: float = 0.0
    upstream_connect_failures: float = 0.0
    upstream_brokers: float = 0.0

    @property
    def requests(self) -> float:
        return sum(a.requests for a in self.apis.values())

    @property
    def bytes_in(self) -> float:
        return sum(a.bytes_in for a in self.apis.values())

    @property
    def bytes_out(self) -> float:
        return sum(a.bytes_out for a in self.apis.values())

    def quota(self, client_id: str) -> QuotaCounts:
        return self.quotas.get(client_id) or QuotaCounts()


def read_proxy_counts(registry: CollectorRegistry) -> ProxyCounts:
    """Read every kafka_quota_proxy_* sample from the registry (safe from any thread)."""
    out = ProxyCounts()

    def api(labels: Mapping[str, str]) -> ApiCounts:
        return out.apis.setdefault(labels.get("api", "?"), ApiCounts())

    def quota(labels: Mapping[str, str]) -> QuotaCounts:
        return out.quotas.setdefault(labels.get("client_id", ""), QuotaCounts())

    for family in registry.collect():
        for s in family.samples:
            name = s.name.removeprefix(METRIC_PREFIX)
            if name == "requests_total":
                api(s.labels).requests = s.value
            elif name == "request_bytes_total":
                api(s.labels).bytes_in = s.value
            elif name == "response_bytes_total":
                api(s.labels).bytes_out = s.value
            elif name == "upstream_latency_seconds_sum":
                api(s.labels).latency_sum = s.value
            elif name == "upstream_latency_seconds_count":
                api(s.labels).latency_count = s.value
            elif name == "upstream_latency_seconds_bucket":
                api(s.labels).buckets.append((float(s.labels["le"]), s.value))
            elif name == "connections_open":
                out.connections_open = s.value
            elif name == "connections_accepted_total":
                out.connections_accepted = s.value
            elif name == "protocol_errors_total":
                out.protocol_errors += s.value
            elif name == "upstream_connect_failures_total":
                out.upstream_connect_failures = s.value
            elif name == "upstream_brokers":
                out.upstream_brokers = s.value
            elif name == "byte_rate" and s.labels.get("quota_type") == "producer_byte_rate":
                q = quota(s.labels)
                q.byte_rate = (q.byte_rate or 0.0) + s.value
            elif name == "quota_limit" and s.labels.get("quota_type") == "producer_byte_rate":
                q = quota(s.labels)
                q.limit = max(q.limit or 0.0, s.value)
            elif name == "throttle_time_ms_total":
                quota(s.labels).throttle_ms += s.value
            elif name == "throttled_requests_total":
                quota(s.labels).throttled += s.value
    return out


class Rates:
    """Per-second rates of named counters over the last RATE_WINDOW_SECONDS."""

    def __init__(self, window: float = RATE_WINDOW_SECONDS) -> None:
        self.window = window
        self._history: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, now: float, values: Mapping[str, float]) -> None:
        self._history.append((now, dict(values)))
        while len(self._history) > 2 and self._history[1][0] <= now - self.window:
            self._history.popleft()

    def __getitem__(self, key: str) -> float:
        if len(self._history) < 2:
            return 0.0
        (t0, v0), (t1, v1) = self._history[0], self._history[-1]
        if t1 <= t0:
            return 0.0
        return max(0.0, (v1.get(key, 0.0) - v0.get(key, 0.0)) / (t1 - t0))


def client_values(producers: Iterable[ProducerView], consumer: ClientCounts,
                  proxy: ProxyCounts) -> dict[str, float]:
    """The counters whose rates the view shows, under the names `Rates` is asked for."""
    values = {"consumer.records": float(consumer.records), "consumer.bytes": float(consumer.bytes),
              "proxy.requests": proxy.requests, "proxy.in": proxy.bytes_in, "proxy.out": proxy.bytes_out}
    for p in producers:
        values[f"{p.key}.records"] = float(p.counts.records)
        values[f"{p.key}.bytes"] = float(p.counts.bytes)
        q = proxy.quota(p.client_id)
        values[f"{p.key}.throttle_ms"] = q.throttle_ms
        values[f"{p.key}.throttled"] = q.throttled
    for name, a in proxy.apis.items():
        values[f"api.{name}.requests"] = a.requests
        values[f"api.{name}.in"] = a.bytes_in
        values[f"api.{name}.out"] = a.bytes_out
    return values
