"""Topic quotas with a plain integer clock: the draft's split over partition leaders, leadership
changes, and Kafka's rate and throttle formula on a topic's bytes."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.sensors import LocalSensors
from kafka_quota_proxy.quota.topics import Leadership, TopicQuotaManager

P = QuotaKey.PRODUCER_BYTE_RATE
F = QuotaKey.CONSUMER_BYTE_RATE
CONFIG = MetricConfig()  # N = 11, W = 1 s
A, B, C = "10.0.0.1:9092", "10.0.0.2:9092", "10.0.0.3:9092"


def T(topic: str) -> QuotaEntity:
    return QuotaEntity(topic=topic)


def manager(store: QuotaStore, leadership: Leadership, broker: str | None, key: QuotaKey = P,
            brokers: int = 3) -> TopicQuotaManager:
    return TopicQuotaManager(key, store, CONFIG, LocalSensors(CONFIG), leadership, broker,
                             brokers=lambda: brokers)


def eight_partitions() -> Leadership:
    # The draft's example: a broker that leads 3 of a topic's 8 partitions allows it 3/8.
    leadership = Leadership()
    leadership.observe("orders", [A, A, A, B, B, B, C, C])
    return leadership


def test_each_broker_allows_its_share_of_the_partitions_it_leads() -> None:
    store = QuotaStore({T("orders"): {P: 8000.0}})
    leadership = eight_partitions()
    assert manager(store, leadership, A).bound("orders") == 3000.0
    assert manager(store, leadership, B).bound("orders") == 3000.0
    assert manager(store, leadership, C).bound("orders") == 2000.0


def test_scope_proxy_has_the_whole_budget() -> None:
    store = QuotaStore({T("orders"): {P: 8000.0}})
    assert manager(store, eight_partitions(), None).bound("orders") == 8000.0


def test_a_topic_without_a_quota_is_unlimited_and_not_measured() -> None:
    store = QuotaStore({T("orders"): {P: 8000.0}})
    m = manager(store, eight_partitions(), A)
    charge = m.record("payments", 10**9, 0)
    assert (charge.throttle_ms, charge.bound) == (0, None)
    assert m.measure("payments", 0) == 0.0
    assert len(m.sensors) == 0


def test_the_default_topic_covers_every_topic_without_its_own() -> None:
    store = QuotaStore({T(DEFAULT): {P: 800.0}, T("orders"): {P: 8000.0}})
    m = manager(store, eight_partitions(), None)
    assert m.quota("orders") == 8000.0
    assert m.quota("anything") == 800.0
    assert m.bound("anything") == 800.0


def test_consumer_and_producer_budgets_are_separate_keys() -> None:
    store = QuotaStore({T("orders"): {P: 8000.0}})
    assert manager(store, eight_partitions(), A, key=F).bound("orders") is None


def test_the_split_follows_a_leadership_change() -> None:
    # Broker C fails over: A takes one of its partitions and B the other. The next Metadata the
    # proxy sees moves the budget with them, and what was measured stays measured.
    store = QuotaStore({T("orders"): {P: 8000.0}})
    leadership = eight_partitions()
    on_a = manager(store, leadership, A)
    on_c = manager(store, leadership, C)
    assert on_a.record("orders", 30_000, 0).throttle_ms == 0  # 3000 B/s over 10 s: at its bound
    version = leadership.version
    leadership.observe("orders", [A, A, A, B, B, B, A, B])
    assert leadership.version == version + 1
    assert on_a.bound("orders") == 4000.0
    assert manager(store, leadership, B).bound("orders") == 4000.0
    # C leads nothing now: bytes there go by the even split until Metadata says otherwise.
    assert on_c.bound("orders") == 8000.0 / 3
    assert on_a.measure("orders", 0) == 3000.0
    leadership.observe("orders", [A, A, A, B, B, B, A, B])
    assert leadership.version == version + 1  # the same split is no change


def test_a_partition_without_a_leader_keeps_its_part_from_everyone() -> None:
    store = QuotaStore({T("orders"): {P: 8000.0}})
    leadership = Leadership()
    leadership.observe("orders", [A, A, A, B, B, B, None, None])
    assert manager(store, leadership, A).bound("orders") == 3000.0


def test_a_topic_no_metadata_described_yet_gets_the_even_split() -> None:
    store = QuotaStore({T("orders"): {P: 9000.0}})
    assert manager(store, Leadership(), A, brokers=3).bound("orders") == 3000.0


def test_forgotten_topic_and_its_ids() -> None:
    leadership = Leadership()
    topic_id = bytes(range(16))
    leadership.observe("orders", [A, B], topic_id=topic_id)
    leadership.observe("nameless", [A], topic_id=bytes(16))  # the null id maps to nothing
    assert leadership.named(None, topic_id) == "orders"
    assert leadership.named(None, bytes(16)) is None
    assert leadership.partitions("orders") == 2
    leadership.forget("orders")
    assert leadership.named(None, topic_id) is None
    assert leadership.share("orders", A) is None


def test_kafka_throttle_on_a_topics_bytes() -> None:
    # Section 11.1 of the reference with a topic in place of a client: 6000 B at t0 over the
    # fresh 10 s window is 600 B/s against 500: (600 - 500)/500 * 10000 = 2000 ms.
    store = QuotaStore({T("orders"): {P: 500.0}})
    m = manager(store, Leadership(), None)
    charge = m.record("orders", 6000, 0)
    assert (charge.throttle_ms, charge.bound) == (2000, 500.0)


def test_kafka_quota_violation_scenario_on_a_topic() -> None:
    # ClientQuotaManagerTest.testQuotaViolation's numbers, measured on a topic.
    store = QuotaStore({T("orders"): {P: 500.0}})
    m = manager(store, Leadership(), None)
    t = 0
    for _ in range(10):
        assert m.record("orders", 400, t).throttle_ms == 0
        t += 1000
    t += 500
    assert m.record("orders", 2300, t).throttle_ms == 2100


def test_unrecord_takes_back_bytes_not_delivered() -> None:
    store = QuotaStore({T("orders"): {F: 500.0}})
    m = manager(store, Leadership(), None, key=F)
    assert m.record("orders", 6000, 0).throttle_ms == 2000
    m.unrecord("orders", 6000, 0)
    assert m.measure("orders", 0) == 0.0
    assert m.record("orders", 5000, 0).throttle_ms == 0


def test_admit_takes_bytes_while_within_and_refuses_them_while_over() -> None:
    m = manager(QuotaStore({T("orders"): {P: 500.0}}), Leadership(), None)
    # The bytes that take the rate over pass, as on Kafka: 6000 B over the fresh 10 s window.
    assert m.admit("orders", 6000, 0).throttle_ms == 0
    # Over now (600 B/s): refused, not recorded, with Kafka's throttle for the rate as it is.
    refused = m.admit("orders", 10, 0)
    assert (refused.throttle_ms, refused.bound) == (2000, 500.0)
    assert m.measure("orders", 0) == 600.0
    # Still over 2 s later: the fresh window is still 10 s, so the rate is what it was.
    assert m.admit("orders", 10, 2000).throttle_ms == 2000
    # Once the burst's sample has aged out of the 11 s the rate covers, bytes are taken at once.
    assert m.admit("orders", 10, 11_000).throttle_ms == 0
    assert m.measure("orders", 11_000) == 1.0


def test_admit_without_refusing_records_and_reports() -> None:
    # Observe mode, and acks=0, which cannot be refused: the bytes count, the throttle is told.
    m = manager(QuotaStore({T("orders"): {P: 500.0}}), Leadership(), None)
    m.admit("orders", 6000, 0)
    assert m.admit("orders", 1000, 0, refuse=False).throttle_ms == 2000
    assert m.measure("orders", 0) == 700.0


def test_admit_of_a_topic_without_a_quota() -> None:
    m = manager(QuotaStore({T("orders"): {P: 500.0}}), Leadership(), None)
    assert m.admit("other", 10**9, 0).throttle_ms == 0
    assert len(m.sensors) == 0


def test_topic_quotas_are_sticky_per_key_and_leave_client_flags_alone() -> None:
    store = QuotaStore()
    m = manager(store, Leadership(), None)
    assert not m.enabled
    store.set(T("orders"), P, 100.0)
    store.remove(T("orders"), P)
    assert m.enabled
    assert not store.topic_quotas_enabled(F)
    assert not store.quota_types_enabled(P)  # client byte-rate measuring does not start


def test_only_byte_rates_are_topic_quotas() -> None:
    with pytest.raises(ValueError, match="not a topic quota"):
        manager(QuotaStore(), Leadership(), None, key=QuotaKey.REQUEST_PERCENTAGE)


def test_topics_lists_what_is_measured() -> None:
    m = manager(QuotaStore({T(DEFAULT): {P: 500.0}}), Leadership(), None)
    m.record("a", 100, 0)
    m.record("b", 200, 0)
    assert sorted((name, rate.measure(0)) for name, rate in m.topics(0)) == [("a", 10.0), ("b", 20.0)]
