"""Prometheus metrics of the proxy itself. One registry per Proxy, so tests can run several."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from protocol.apis import api_name

# Latency buckets in seconds: a proxy hop is sub-millisecond, a long-poll Fetch up to ~30 s.
LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(slots=True)
class ApiMetrics:
    """Pre-bound children for one API key: label lookups are too slow for the hot path."""

    requests: object
    request_bytes: object
    response_bytes: object
    latency: object


@dataclass
class ProxyMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        p = "kafka_quota_proxy_"
        self.requests = Counter(p + "requests", "Requests received from clients", ["api"], registry=r)
        self.request_bytes = Counter(p + "request_bytes", "Request bytes received from clients, "
                                     "size prefix included", ["api"], registry=r)
        self.response_bytes = Counter(p + "response_bytes", "Response bytes sent to clients",
                                      ["api"], registry=r)
        self.upstream_latency = Histogram(p + "upstream_latency_seconds", "Time from forwarding a "
                                          "request to the broker until its response arrives",
                                          ["api"], buckets=LATENCY_BUCKETS, registry=r)
        self.connections_open = Gauge(p + "connections_open", "Client connections open", registry=r)
        self.connections_accepted = Counter(p + "connections_accepted", "Client connections accepted",
                                            registry=r)
        self.connections_closed = Counter(p + "connections_closed", "Client connections closed",
                                          registry=r)
        self.protocol_errors = Counter(p + "protocol_errors", "Client connections closed for bad "
                                       "input, by kind", ["kind"], registry=r)
        self.auth_failures = Counter(p + "authentication_failures", "Failed SASL authentications "
                                     "(terminate mode), by mechanism", ["mechanism"], registry=r)
        self.upstream_connect_failures = Counter(p + "upstream_connect_failures", "Failed connection "
                                                 "attempts to brokers", registry=r)
        self._apis: dict[int, ApiMetrics] = {}

    def api(self, api_key: int) -> ApiMetrics:
        found = self._apis.get(api_key)
        if found is None:
            name = api_name(api_key)
            found = ApiMetrics(self.requests.labels(name), self.request_bytes.labels(name),
                               self.response_bytes.labels(name), self.upstream_latency.labels(name))
            self._apis[api_key] = found
        return found
