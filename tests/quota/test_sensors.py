"""LocalSensors: one stat per key, 1 h idle expiry (counters reset), an entity cap."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.sensors import LocalSensors, Sensors
from kafka_quota_proxy.quota.token_bucket import TokenBucket

HOUR = 3_600_000
CONFIG = MetricConfig()


def new_rate() -> Rate:
    return Rate(CONFIG)


def test_is_a_sensors_store() -> None:
    store: Sensors = LocalSensors(CONFIG)
    assert len(store) == 0
    assert store.dropped == 0


def test_get_or_create_returns_the_same_stat() -> None:
    sensors = LocalSensors(CONFIG)
    a = sensors.get_or_create(("Produce", "", "app"), 0, new_rate)
    assert isinstance(a, Rate)
    assert sensors.get_or_create(("Produce", "", "app"), 10, new_rate) is a
    assert sensors.get(("Produce", "", "app"), 10) is a
    b = sensors.get_or_create(("Fetch", "", "app"), 10, new_rate)
    assert b is not a
    assert len(sensors) == 2


def test_factories_make_any_stat() -> None:
    sensors = LocalSensors(CONFIG)
    bucket = sensors.get_or_create(("ControllerMutation", "u", "c"), 0, lambda: TokenBucket(10, CONFIG))
    assert isinstance(bucket, TokenBucket)
    assert bucket.tokens(0) == 110.0


def test_rate_uses_the_store_config() -> None:
    sensors = LocalSensors(MetricConfig(samples=2, window_ms=500))
    rate = sensors.rate(("ip", "10.0.0.1"), 0)
    assert rate is not None
    assert rate.config == MetricConfig(samples=2, window_ms=500)
    assert sensors.rate(("ip", "10.0.0.1"), 0) is rate


def test_expiry_after_an_hour_idle_resets_the_counters() -> None:
    sensors = LocalSensors(CONFIG)
    key = ("Produce", "", "app")
    rate = sensors.get_or_create(key, 0, new_rate)
    assert rate is not None
    rate.record(500, 0)
    # Touched (about to record) at 1000: idle is counted from there.
    assert sensors.get_or_create(key, 1000, new_rate) is rate
    # Exactly one hour idle is not yet expired (Kafka: idle > expiry).
    assert sensors.get_or_create(key, 1000 + HOUR, new_rate) is rate
    again = sensors.get_or_create(key, 1000 + 2 * HOUR + 1, new_rate)
    assert again is not rate
    assert again is not None
    assert again.total(1000 + 2 * HOUR + 1) == 0.0


def test_get_does_not_keep_an_entry_alive() -> None:
    sensors = LocalSensors(CONFIG)
    key = ("Fetch", "u", "")
    rate = sensors.get_or_create(key, 0, new_rate)
    assert sensors.get(key, HOUR) is rate
    assert sensors.get(key, HOUR + 1) is None
    assert len(sensors) == 0


def test_expire_and_entries() -> None:
    sensors = LocalSensors(CONFIG)
    sensors.get_or_create("a", 0, new_rate)
    sensors.get_or_create("b", 10, new_rate)
    sensors.get_or_create("c", 20, new_rate)
    sensors.get_or_create("a", 30, new_rate)  # a is now the most recently used
    assert sensors.expire(HOUR + 10) == 0
    assert sensors.expire(HOUR + 11) == 1  # b
    assert [key for key, _ in sensors.entries(HOUR + 25)] == ["a"]  # c expired too
    assert len(sensors) == 1
    assert sensors.entries(HOUR + 31) == []


def test_remove() -> None:
    sensors = LocalSensors(CONFIG)
    rate = sensors.get_or_create("a", 0, new_rate)
    sensors.remove("a")
    sensors.remove("never")
    assert sensors.get("a", 0) is None
    assert sensors.get_or_create("a", 0, new_rate) is not rate


def test_entity_cap_refuses_and_counts_dropped() -> None:
    sensors = LocalSensors(CONFIG, max_entities=2)
    a = sensors.get_or_create("a", 0, new_rate)
    sensors.get_or_create("b", 0, new_rate)
    assert sensors.get_or_create("c", 5, new_rate) is None
    assert sensors.get_or_create("d", 5, new_rate) is None
    assert sensors.dropped == 2
    assert sensors.get_or_create("a", 5, new_rate) is a  # existing entries still work
    assert len(sensors) == 2
    # Once b has expired (a was touched at 5), a creation sweeps it and fits.
    c = sensors.get_or_create("c", HOUR + 1, new_rate)
    assert c is not None
    assert sensors.dropped == 2
    assert [key for key, _ in sensors.entries(HOUR + 1)] == ["a", "c"]


def test_a_cap_of_zero_measures_nothing() -> None:
    sensors = LocalSensors(CONFIG, max_entities=0)
    assert sensors.get_or_create("a", 0, new_rate) is None
    assert sensors.dropped == 1


def test_custom_expiry() -> None:
    sensors = LocalSensors(CONFIG, expiry_ms=100)
    rate = sensors.get_or_create("a", 0, new_rate)
    assert sensors.get_or_create("a", 100, new_rate) is rate
    assert sensors.get_or_create("a", 201, new_rate) is not rate


@pytest.mark.parametrize("kwargs", [{"max_entities": -1}, {"expiry_ms": -1}])
def test_rejects_negative_limits(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        LocalSensors(CONFIG, **kwargs)


def test_a_kept_handle_is_touched_like_its_key_until_the_entry_goes() -> None:
    s = LocalSensors(MetricConfig(), max_entities=10, expiry_ms=1000)
    a = s.handle("a", 0, lambda: Rate(MetricConfig()))
    b = s.handle("b", 100, lambda: Rate(MetricConfig()))
    assert a is not None and b is not None and s.handle("a", 50, list) is a  # found, not made
    assert s.touch(a, 900) and a.last_ms == 900
    # Touched: "a" is now the most recently used, so expiry at 1200 takes "b" (last used at 100).
    assert s.expire(1200) == 1 and not b.live and s.get("b", 1200) is None
    assert not s.touch(b, 1200)
    assert not s.touch(a, 2000)  # idle for more than the expiry
    s.remove("a")
    assert not a.live and not s.touch(a, 2000) and len(s) == 0
