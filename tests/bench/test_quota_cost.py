"""bench.quota_cost runs (a few calls per round here) and times what it says it times: the
quota stages do real accounting work for 100 tenants and next to none with no quota."""

from __future__ import annotations

import pytest

from bench import quota_cost
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.quota.entities import QuotaKey
from tests.support.managers import fetch_bytes, produce_bytes


def test_quota_cost_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quota_cost, "CALLS", 200)
    rows = quota_cost.run()
    assert [name for name, _ in rows] == [
        "Produce: quota stages, no quota configured",
        "Produce: quota stages, 100 tenants' producer_byte_rate",
        "Produce: added by the quotas",
        "Produce: the same quotas shared through a store",
        "Produce: added by sharing them",
        "Fetch: quota stages, no quota configured",
        "Fetch: quota stages, 100 tenants' consumer_byte_rate",
        "Fetch: added by the quotas",
        "Fetch: the same quotas shared through a store",
        "Fetch: added by sharing them",
        "usage_log.topics, Produce of 1 partition(s)", "usage_log.topics, Fetch response of 1 partition(s)",
        "usage_log.topics, Produce of 10 partition(s)", "usage_log.topics, Fetch response of 10 partition(s)"]
    assert all(value.endswith(" µs") for _, value in rows)


def test_the_usage_walks_find_every_partition() -> None:
    """What topic_usage_ns times counts the bytes it says: 10 partitions of one batch each."""
    one_produce, one_fetch, contexts = quota_cost.topic_usage_calls(10)
    one_produce()
    one_fetch()
    batch = len(quota_cost.record_batch(16, 1024))
    assert [c.topic_bytes for c in contexts] == [[("bench", 10 * batch, 0)]] * 2


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("key", [QuotaKey.PRODUCER_BYTE_RATE, QuotaKey.CONSUMER_BYTE_RATE])
def test_every_tenant_is_measured(monkeypatch: pytest.MonkeyPatch, key: QuotaKey, shared: bool) -> None:
    """With the quotas configured, the timed requests are charged, each tenant on its own sensor
    (a shared one too, when timed as shared)."""
    engines: list[QuotaEngine] = []
    real = quota_cost._engine

    def recording(k: QuotaKey | None, shared: bool = False) -> QuotaEngine:
        engines.append(real(k, shared))
        return engines[-1]
    monkeypatch.setattr(quota_cost, "_engine", recording)
    monkeypatch.setattr(quota_cost, "CALLS", 200)
    produce = key == QuotaKey.PRODUCER_BYTE_RATE
    (quota_cost.produce_ns if produce else quota_cost.fetch_ns)(key, shared)
    (engine,) = engines
    assert (engine.shared is not None) == shared
    if shared:
        # A consumer quota's rate keeps beside it whether the replica fetched in each sample.
        per_tenant = 1 if produce else 2
        assert engine.shared is not None and len(engine.shared) == per_tenant * quota_cost.TENANTS
    managers = engine.scope("127.0.0.1:9092")
    charged = produce_bytes(managers) if produce else fetch_bytes(managers)
    assert len(charged.sensors) == quota_cost.TENANTS
    assert all(charged.measure("ANONYMOUS", f"tenant-{i:03d}", engine.clock()) > 0
               for i in range(quota_cost.TENANTS))
