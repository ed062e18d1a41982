"""The proxy's per-API metrics: plain counters on the request path, Prometheus series at scrape."""

from __future__ import annotations

from kafka_quota_proxy.proxy.observability.metrics import LATENCY_BUCKETS, ProxyMetrics


def test_per_api_counters_and_latency_histogram() -> None:
    m = ProxyMetrics()
    fetch = m.api(1)
    assert m.api(1) is fetch
    fetch.requests += 2
    fetch.request_bytes += 100
    fetch.response_bytes += 50
    for seconds in (0.0002, 0.0003, 0.0005, 31.0):  # on a bound counts in that bucket (le)
        fetch.observe_latency(seconds)
    get = m.registry.get_sample_value
    assert get("kafka_quota_proxy_requests_total", {"api": "Fetch"}) == 2
    assert get("kafka_quota_proxy_request_bytes_total", {"api": "Fetch"}) == 100
    assert get("kafka_quota_proxy_response_bytes_total", {"api": "Fetch"}) == 50
    buckets = {le: get("kafka_quota_proxy_upstream_latency_seconds_bucket", {"api": "Fetch", "le": le})
               for le in ("0.0002", "0.0005", "30.0", "+Inf")}
    assert buckets == {"0.0002": 1, "0.0005": 3, "30.0": 3, "+Inf": 4}
    assert get("kafka_quota_proxy_upstream_latency_seconds_count", {"api": "Fetch"}) == 4
    assert get("kafka_quota_proxy_upstream_latency_seconds_sum", {"api": "Fetch"}) == 0.001 + 31.0
    assert len(fetch.latency_buckets) == len(LATENCY_BUCKETS) + 1
    assert get("kafka_quota_proxy_requests_total", {"api": "Produce"}) is None  # never seen
