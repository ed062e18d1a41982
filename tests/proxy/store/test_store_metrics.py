"""The shared store's metrics of the paced quotas' turns (quota/turns.py), read off the sync at
scrape time: the quotas this replica's clients wait on, and those whose queue it heads."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kafka_quota_proxy.config.store_settings import StoreSettings
from kafka_quota_proxy.proxy.observability.store_metrics import StoreCollector
from kafka_quota_proxy.proxy.store.sync import StoreSync
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.shared import SharedQuotas

P = "kafka_quota_proxy_"


def test_the_turns_a_replica_waits_for_and_heads_are_gauges() -> None:
    shared = SharedQuotas(MetricConfig(samples=11, window_ms=1000))
    sync = StoreSync(StoreSettings(url="redis://127.0.0.1:1"), shared)  # never connects here
    registry = CollectorRegistry()
    registry.register(StoreCollector(sync, lambda: 0.0))
    assert registry.get_sample_value(P + "store_turns_waiting") == 0
    turns = shared.turns
    assert turns is not None  # a sync keeps turns on the store
    turns.wait("a", 1_000)
    turns.wait("b", 1_000)
    turns.answered({"a"}, {"a", "b"})
    assert registry.get_sample_value(P + "store_turns_waiting") == 2
    assert registry.get_sample_value(P + "store_turns_heading") == 1
