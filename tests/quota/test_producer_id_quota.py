"""The producer_ids_rate quota (KIP-936): the manager on a fake clock, the key's place in the
admin API and the config file. N = 11 samples of W = 1 s, so a fresh window is 10 s and a
quota of 0.5 ids/s lets 5 new ids through before the first throttle."""

from __future__ import annotations

import math

import pytest

from kafka_quota_proxy.config import ConfigError
from kafka_quota_proxy.config.quota_settings import (
    ProducerIdSettings,
    parse_quota_list,
    parse_quota_section,
    validate_quota_entries,
)
from kafka_quota_proxy.protocol.error_codes import INVALID_REQUEST
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.quota.admin_api import alter_client_quotas, describe_client_quotas
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.producer_ids import ProducerIdCache, ProducerIdCharge, ProducerIdQuotaManager
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.sensors import LocalSensors

K = QuotaKey.PRODUCER_IDS_RATE
C = ProducerIdCharge
T0 = 1_000_000


def manager(quotas: dict[QuotaEntity, float] | None = None, max_users: int = 100) -> ProducerIdQuotaManager:
    store = QuotaStore({e: {K: v} for e, v in (quotas or {QuotaEntity(user="alice"): 0.5}).items()})
    config = MetricConfig(samples=11, window_ms=1000)
    return ProducerIdQuotaManager(store, config, LocalSensors(config),
                                  ProducerIdCache(1000, 1000, 0.01, max_users, 1 << 20, seed=7))


def kafka_throttle(measured: float, quota: float, window_ms: float = 10_000) -> int:
    return math.floor((measured - quota) / quota * window_ms + 0.5)


# --- throttle (the default action) ---------------------------------------------------------------

def test_only_new_ids_count_and_over_quota_throttles() -> None:
    m = manager()
    assert m.charge("alice", [1, 2, 3], T0) == C(3, 0)
    assert m.charge("alice", [1, 2, 3], T0) == C(0, 0)  # seen: nothing counted
    assert m.charge("alice", [4, 4, 5], T0) == C(2, 0)  # an id twice in one request counts once
    assert m.measure("alice", T0) == 0.5  # 5 ids over the fresh 10 s window: at the quota
    charge = m.charge("alice", [6], T0)
    assert charge.new_ids == 1 and not charge.rejected
    assert charge.throttle_ms == kafka_throttle(0.6, 0.5) == 2000  # about 1/Q s per id over
    assert m.charge("alice", [6], T0) == C(0, 0)  # remembered even though it was throttled


def test_the_throttle_follows_the_window() -> None:
    m = manager()
    m.charge("alice", list(range(6)), T0)
    # 6 ids over 10.5 s: (6 / 10.5 - 0.5) / 0.5 * 10500
    assert m.charge("alice", [6], T0 + 500).throttle_ms == kafka_throttle(7 / 10.5, 0.5, 10_500) == 3500


def test_ids_count_again_after_the_cache_forgets_them() -> None:
    m = manager()
    assert m.charge("alice", [1], T0).new_ids == 1
    assert m.charge("alice", [1], T0 + 1499).new_ids == 0
    assert m.charge("alice", [1], T0 + 1500).new_ids == 1  # its filter is 1.5 windows old


def test_negative_ids_and_users_without_a_quota() -> None:
    m = manager()
    assert m.charge("alice", [-1, -1], T0) == C(0, 0)
    # Measured (the quota type is enabled) but never throttled: no quota applies to bob.
    assert m.charge("bob", list(range(100)), T0) == C(100, 0)
    assert m.measure("bob", T0) == 10.0


def test_the_default_user_quota_applies_to_each_user_alone() -> None:
    m = manager({QuotaEntity(user=DEFAULT): 0.5, QuotaEntity(user="carol"): 100.0})
    assert m.charge("alice", list(range(5)), T0).throttle_ms == 0
    assert m.charge("bob", list(range(5)), T0).throttle_ms == 0  # a sensor of its own
    assert m.charge("alice", [99], T0).throttle_ms == 2000
    assert m.charge("carol", list(range(500)), T0).throttle_ms == 0  # its own quota wins


def test_nothing_is_measured_before_any_producer_ids_rate_exists() -> None:
    store = QuotaStore({QuotaEntity(user="alice"): {QuotaKey.PRODUCER_BYTE_RATE: 10.0}})
    config = MetricConfig(samples=11, window_ms=1000)
    m = ProducerIdQuotaManager(store, config, LocalSensors(config), ProducerIdCache(1000))
    assert not m.quotas_enabled
    assert m.charge("alice", [1, 2], T0) == C(0, 0)
    assert len(m.cache) == 0


# --- reject ------------------------------------------------------------------------------------------

def test_reject_refuses_without_remembering_or_recording() -> None:
    m = manager()
    assert m.charge("alice", list(range(5)), T0, strict=True) == C(5, 0)
    refused = m.charge("alice", [5, 6], T0, strict=True)
    assert refused.rejected and refused.new_ids == 2
    assert refused.throttle_ms == kafka_throttle(0.7, 0.5) == 4000  # what counting them would cost
    assert m.measure("alice", T0) == 0.5  # un-recorded
    assert not m.cache.seen("alice", 5, T0) and not m.cache.seen("alice", 6, T0)
    assert m.rejections == {"alice": 1}
    # Seen ids pass whatever the rate: only new ones are judged.
    assert m.charge("alice", [0, 1, 2], T0, strict=True) == C(0, 0)
    # Once the window has moved on, the same ids are judged afresh and accepted.
    # (7 ids over the 10 s every window starts with would still be over; 7 over 14 s is not.)
    assert m.charge("alice", [5, 6], T0 + 4000, strict=True).rejected
    assert m.charge("alice", [5, 6], T0 + 14_000, strict=True) == C(2, 0)
    assert m.cache.seen("alice", 5, T0 + 14_000)


def test_reject_leaves_users_the_cache_cannot_hold_alone() -> None:
    m = manager({QuotaEntity(user=DEFAULT): 0.5}, max_users=1)
    m.charge("alice", [1], T0, strict=True)
    assert m.charge("bob", list(range(100)), T0, strict=True) == C(0, 0)  # not counted, not refused
    assert m.charge("bob", list(range(100)), T0) == C(0, 0)
    assert m.cache.dropped_users == 200  # every id turned away counts


def test_expire_drops_idle_users_and_their_rejection_counts() -> None:
    m = manager()
    m.charge("alice", list(range(5)), T0)
    m.charge("alice", [7], T0, strict=True)
    assert m.rejections == {"alice": 1}
    m.expire(T0 + 1499)
    assert m.cache.users() == ["alice"] and m.rejections == {"alice": 1}
    m.expire(T0 + 1500)
    assert m.cache.users() == [] and m.rejections == {}


# --- the key in the admin API and the config file ---------------------------------------------------

def test_alter_accepts_producer_ids_rate_on_users_alone() -> None:
    entries = [
        ([("user", "alice")], [("producer_ids_rate", 0.25, False)]),
        ([("user", None)], [("producer_ids_rate", 10.0, False)]),
        ([("client-id", "app")], [("producer_ids_rate", 1.0, False)]),
        ([("user", "bob"), ("client-id", "app")], [("producer_ids_rate", 1.0, False)]),
        ([("ip", "10.0.0.1")], [("producer_ids_rate", 1.0, False)]),
        ([("user", "carol")], [("producer_ids_rate", 0.0, False)]),
    ]
    result = alter_client_quotas({}, entries, validate_only=False)
    users_only = ("producer_ids_rate applies to user entities alone (a user or the default user, "
                  "no client-id)")
    assert result.results == [(0, None), (0, None), (INVALID_REQUEST, users_only),
                              (INVALID_REQUEST, users_only), (INVALID_REQUEST, users_only),
                              (INVALID_REQUEST, "Quota producer_ids_rate must be greater than 0")]
    assert result.quotas == {QuotaEntity(user="alice"): {K: 0.25}, QuotaEntity(user=DEFAULT): {K: 10.0}}
    described = describe_client_quotas(result.quotas, [("user", 2, None)], strict=False)
    assert described.error_code == 0
    assert described.entries == [([("user", None)], {"producer_ids_rate": 10.0}),
                                 ([("user", "alice")], {"producer_ids_rate": 0.25})]


def test_removing_producer_ids_rate_from_a_client_entity_is_a_no_op() -> None:
    result = alter_client_quotas({QuotaEntity(client_id="app"): {QuotaKey.PRODUCER_BYTE_RATE: 5.0}},
                                 [([("client-id", "app")], [("producer_ids_rate", 0.0, True)])],
                                 validate_only=False)
    assert result.results == [(0, None)]
    assert result.quotas == {QuotaEntity(client_id="app"): {QuotaKey.PRODUCER_BYTE_RATE: 5.0}}


def test_the_config_file_takes_the_key_with_the_same_rules() -> None:
    ok = parse_quota_list([{"user": "alice", "producer_ids_rate": 0.05},
                           {"user": "<default>", "producer_ids_rate": 1}])
    assert validate_quota_entries(ok) == {QuotaEntity(user="alice"): {K: 0.05},
                                          QuotaEntity(user=DEFAULT): {K: 1.0}}
    bad = parse_quota_list([{"client-id": "app", "producer_ids_rate": 1}])
    with pytest.raises(ConfigError, match=r"quotas\[0\]: producer_ids_rate applies to user entities alone"):
        validate_quota_entries(bad)


def test_producer_ids_settings() -> None:
    assert parse_quota_section({}).producer_ids == ProducerIdSettings()
    s = ProducerIdSettings()
    assert (s.action, s.window_num, s.window_size_seconds, s.cleanup_interval_ms) == (
        "throttle", 11, 3600, 10)
    got = parse_quota_section({"producer_ids": {"action": "reject", "window_size_seconds": 2,
                                                "false_positive_rate": 0.001, "max_users": 0}}).producer_ids
    assert (got.action, got.window_ms, got.false_positive_rate, got.max_users) == ("reject", 2000, 0.001, 0)


@pytest.mark.parametrize(("raw", "message"), [
    ({"action": "drop"}, "quota.producer_ids.action: expected one of throttle, reject, got 'drop'"),
    ({"window_num": 0}, "quota.producer_ids.window_num: expected a whole number >= 1, got 0"),
    ({"false_positive_rate": 1}, "quota.producer_ids.false_positive_rate: expected a number between 0 "
                                 "and 1 (exclusive), got 1"),
    ({"max_users": -1}, "quota.producer_ids.max_users: expected a whole number >= 0, got -1"),
    ({"bits": 3}, "quota.producer_ids.bits: unknown key"),
    ([1], "quota.producer_ids: expected a mapping"),
])
def test_bad_producer_ids_settings(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_quota_section({"producer_ids": raw})
    assert str(info.value).startswith(message)


def test_a_reload_changes_the_action_at_once_and_the_shape_only_at_restart() -> None:
    engine = QuotaEngine(parse_quota_section({}), QuotaStore())
    fresh = parse_quota_section({"producer_ids": {"action": "reject", "window_num": 3, "max_users": 5}})
    assert engine.update(fresh) == ["producer_ids.window_num", "producer_ids.max_users"]
    assert engine.settings.producer_ids == ProducerIdSettings(action="reject")
