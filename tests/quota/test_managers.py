"""Quota managers with a plain integer clock: the scenarios of section 11 with Kafka's numbers."""

from __future__ import annotations

import math

import pytest

from kafka_quota_proxy.quota.connections import ConnectionQuotas, normalize_ip
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.managers import (
    ChargeHandle,
    ClientQuotaManager,
    ClientRequestQuotaManager,
    time_ms_to_percentage,
)
from kafka_quota_proxy.quota.mutations import (
    UNBOUNDED_CONTROLLER_MUTATION_QUOTA,
    ControllerMutationQuotaManager,
    PermissiveControllerMutationQuota,
    StrictControllerMutationQuota,
)
from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.sensors import LocalSensors

P = QuotaKey.PRODUCER_BYTE_RATE
F = QuotaKey.CONSUMER_BYTE_RATE
R = QuotaKey.REQUEST_PERCENTAGE
M = QuotaKey.CONTROLLER_MUTATION_RATE
C = QuotaKey.CONNECTION_CREATION_RATE
CONFIG = MetricConfig()  # N = 11, W = 1 s
HOUR = 3_600_000


def E(user: str | None = None, client_id: str | None = None, ip: str | None = None) -> QuotaEntity:
    return QuotaEntity(user=user, client_id=client_id, ip=ip)


def produce(store: QuotaStore, config: MetricConfig = CONFIG, **kw: int) -> ClientQuotaManager:
    return ClientQuotaManager(P, store, config, LocalSensors(config, **kw))


# --- ClientQuotaManager: byte rates ---------------------------------------------------------

def test_fresh_window_at_the_quota_is_not_throttled() -> None:
    # Section 11.1: 5000 B at t0 over the fresh 10 s window is 500 B/s = the quota.
    m = produce(QuotaStore({E(client_id=DEFAULT): {P: 500.0}}))
    assert m.record_and_get_throttle_ms("ANONYMOUS", "app", 5000, 0) == 0
    assert m.measure("ANONYMOUS", "app", 0) == 500.0


def test_fresh_window_over_the_quota_is_throttled() -> None:
    # Section 11.1: 6000 B -> 600 B/s -> (600 - 500)/500 * 10000 = 2000 ms.
    m = produce(QuotaStore({E(client_id=DEFAULT): {P: 500.0}}))
    assert m.record_and_get_throttle_ms("ANONYMOUS", "app", 6000, 0) == 2000


def test_quota_violation() -> None:
    # ClientQuotaManagerTest.testQuotaViolation
    m = produce(QuotaStore({E(client_id=DEFAULT): {P: 500.0}}))
    t = 0
    for _ in range(10):
        assert m.record_and_get_throttle_ms("ANONYMOUS", "unknown", 400, t) == 0
        t += 1000
    # 400*10 + 2300 = 6300 over 10.5 s (the last window half complete) = 600 B/s:
    # (600 - 500)/500 * 10500 = 2100 ms.
    t += 500
    throttle = m.record_and_get_throttle_ms("ANONYMOUS", "unknown", 2300, t)
    assert throttle == 2100
    t += throttle
    for _ in range(10):
        m.record_and_get_throttle_ms("ANONYMOUS", "unknown", 400, t)
        t += 1000
    assert m.record_and_get_throttle_ms("ANONYMOUS", "unknown", 0, t) == 0  # the burst has rolled over


def test_over_so_far_counts_a_first_burst_that_kafkas_padded_window_lets_through() -> None:
    m = produce(QuotaStore({E(client_id=DEFAULT): {P: 500.0}}))
    handles: dict[object, ChargeHandle] = {}
    assert not m.over_so_far(handles, 0)  # nothing charged yet
    assert m.record_and_get_throttle_ms("ANONYMOUS", "app", 400, 0, handles) == 0
    assert not m.over_so_far(handles, 0)  # 400 B in its first second: within 500 B/s
    assert m.record_and_get_throttle_ms("ANONYMOUS", "app", 400, 10, handles) == 0  # 80 B/s, Kafka's
    assert m.over_so_far(handles, 10)  # but 800 B/s so far
    assert not m.over_so_far(handles, 1600)  # 800 B over 1.6 s
    unlimited = produce(QuotaStore({E(client_id="other"): {P: 500.0}}))
    theirs: dict[object, ChargeHandle] = {}
    unlimited.record_and_get_throttle_ms("ANONYMOUS", "app", 10**9, 0, theirs)
    assert not unlimited.over_so_far(theirs, 0)  # no quota applies to it


def test_nothing_is_recorded_while_no_quota_of_the_type_was_ever_set() -> None:
    sensors = LocalSensors(CONFIG)
    store = QuotaStore({E(client_id=DEFAULT): {F: 1.0}})  # a fetch quota only
    m = ClientQuotaManager(P, store, CONFIG, sensors)
    assert not m.quotas_enabled
    assert m.record_and_get_throttle_ms("u", "c", 10**9, 0) == 0
    m.record_no_throttle("u", "c", 10**9, 0)
    m.unrecord("u", "c", 10**9, 0)
    assert len(sensors) == 0
    assert m.quota("u", "c") is None
    assert m.max_value_in_quota_window("u", "c") == math.inf
    assert m.measure("u", "c", 0) == 0.0


def test_unlimited_clients_are_still_measured_once_enabled() -> None:
    m = produce(QuotaStore({E(user="alice"): {P: 10.0}}))
    assert m.record_and_get_throttle_ms("bob", "app", 10**6, 0) == 0
    assert m.quota("bob", "app") is None
    assert m.measure("bob", "app", 0) == 10**5
    assert m.tags("bob", "app") == ("bob", "")


def test_set_and_remove_default_user_quota() -> None:
    # Section 11.8 / ClientQuotaManagerTest.testSetAndRemoveDefaultUserQuota: 1000 * N = 11000.
    store = QuotaStore()
    m = produce(store)
    assert m.record_and_get_throttle_ms("userA", "client1", 11000, 0) == 0
    assert m.max_value_in_quota_window("userA", "client1") == math.inf
    store.set(E(user=DEFAULT), P, 10.0)
    assert m.quota("userA", "client1") == 10.0
    assert m.max_value_in_quota_window("userA", "client1") == 100.0
    # 11000 over 10 s = 1100 B/s: (1100 - 10)/10 * 10000.
    assert m.record_and_get_throttle_ms("userA", "client1", 11000, 0) == 1_090_000
    store.remove(E(user=DEFAULT), P)
    assert m.quota("userA", "client1") is None
    assert m.max_value_in_quota_window("userA", "client1") == math.inf
    assert m.record_and_get_throttle_ms("userA", "client1", 11000, 0) == 0
    assert m.measure("userA", "client1", 0) == 2200.0  # still recorded: the flags are sticky


@pytest.mark.parametrize("entity", [E(user="userA"), E(user="userA", client_id="client1")])
def test_set_and_remove_user_and_user_client_quota(entity: QuotaEntity) -> None:
    store = QuotaStore()
    m = produce(store)
    store.set(entity, P, 10.0)
    assert m.record_and_get_throttle_ms("userA", "client1", 11000, 0) == 1_090_000
    store.remove(entity, P)
    assert m.quota("userA", "client1") is None
    assert m.record_and_get_throttle_ms("userA", "client1", 11000, 0) == 0


def test_max_value_in_quota_window_with_a_non_default_window() -> None:
    # Section 11.8: N = 4 (3 full windows), default user quota 10 -> 30.
    store = QuotaStore()
    m = ClientQuotaManager(F, store, MetricConfig(samples=4), LocalSensors(CONFIG))
    assert m.max_value_in_quota_window("userA", "client1") == math.inf  # Kafka: Double.MAX_VALUE
    store.set(E(user=DEFAULT), F, 10.0)
    assert m.max_value_in_quota_window("userA", "client1") == 30.0


def test_quota_config_precedence() -> None:
    # ClientQuotaManagerTest.testQuotaConfigPrecedence at one instant (t = 0), so every sensor's
    # window is 10 s; each step records value * N and the exact throttle is asserted.
    store = QuotaStore()
    m = produce(store)
    store.set(E(user=DEFAULT), P, 1000)
    store.set(E(client_id=DEFAULT), P, 2000)
    store.set(E(user=DEFAULT, client_id=DEFAULT), P, 3000)
    store.set(E(user="userA"), P, 4000)
    store.set(E(user="userA", client_id="client1"), P, 5000)
    store.set(E(user="userB"), P, 6000)
    store.set(E(user="userB", client_id="client1"), P, 7000)
    store.set(E(user="userB", client_id=DEFAULT), P, 8000)
    store.set(E(user="userC"), P, 10000)
    store.set(E(client_id="client1"), P, 9000)

    def check(user: str, client: str, bound: float, value: int, throttle: int) -> None:
        assert m.quota(user, client) == bound, (user, client)
        assert m.max_value_in_quota_window(user, client) == bound * 10
        assert m.record_and_get_throttle_ms(user, client, value * 11, 0) == throttle, (user, client)

    check("userA", "client1", 5000, 4500, 0)  # <user, client> beats <user>
    check("userA", "client2", 4000, 4500, 2375)  # <user> beats <client> and the defaults
    check("userA", "client3", 4000, 0, 2375)  # <user> is shared by the clients of the user
    check("userA", "client1", 5000, 0, 0)  # <user, client> is exclusive
    check("userB", "client1", 7000, 8000, 2571)
    check("userB", "client2", 8000, 7000, 0)  # a per-client default, each client its own sensor
    check("userB", "client3", 8000, 7000, 0)
    check("userD", "client1", 3000, 3500, 2833)  # default <user, client>
    check("userD", "client2", 3000, 2500, 0)
    check("userE", "client1", 3000, 2500, 0)

    store.remove(E(user=DEFAULT, client_id=DEFAULT), P)  # back to the <user> default
    check("userD", "client1", 1000, 0, 0)  # the tags changed: a new counter
    check("userE", "client4", 1000, 1500, 6500)
    check("userF", "client4", 1000, 800, 0)  # the default <user> quota is shared by the user's clients
    check("userF", "client5", 1000, 800, 7600)

    store.remove(E(user=DEFAULT), P)  # back to the <client-id> default
    check("userF", "client4", 2000, 0, 0)  # shared by that client-id across users
    check("userF", "client5", 2000, 0, 0)
    check("userF", "client5", 2000, 2500, 3750)
    check("userG", "client5", 2000, 0, 3750)

    store.set(E(user="userA"), P, 8000)
    store.set(E(user="userA", client_id="client1"), P, 10000)
    check("userA", "client2", 8000, 0, 0)
    check("userA", "client2", 8000, 4500, 2375)  # the new value adds to the earlier ones
    check("userA", "client1", 10000, 0, 0)
    check("userA", "client1", 10000, 6000, 1550)
    store.remove(E(user="userA", client_id="client1"), P)
    check("userA", "client6", 8000, 0, 2375)  # the shared user quota
    store.set(E(user="userA", client_id="client6"), P, 11000)
    check("userA", "client6", 11000, 8500, 0)
    store.set(E(user="userA", client_id=DEFAULT), P, 12000)
    store.remove(E(user="userA", client_id="client6"), P)
    check("userA", "client6", 12000, 4000, 1458)  # same tags: adds to the earlier 8500


def test_client_id_only_quotas_leave_an_empty_client_id_unlimited() -> None:
    m = produce(QuotaStore({E(client_id=DEFAULT): {P: 1.0}}))
    assert m.record_and_get_throttle_ms("alice", "", 10**6, 0) == 0
    assert m.record_and_get_throttle_ms("alice", None, 10**6, 0) == 0
    assert m.tags("alice", None) == ("", "")
    assert m.max_value_in_quota_window("alice", "") == math.inf
    assert m.record_and_get_throttle_ms("alice", "app", 100, 0) == 90000


def test_user_quota_is_shared_by_all_clients_of_the_user() -> None:
    m = produce(QuotaStore({E(user="alice"): {P: 500.0}}))
    assert m.record_and_get_throttle_ms("alice", "a", 5000, 0) == 0
    assert m.record_and_get_throttle_ms("alice", "b", 1000, 0) == 2000  # 6000 on (alice, "")
    assert m.record_and_get_throttle_ms("bob", "a", 6000, 0) == 0  # bob: no quota


def test_client_id_is_not_sanitized() -> None:
    sensors = LocalSensors(CONFIG)
    m = ClientQuotaManager(P, QuotaStore({E(client_id=DEFAULT): {P: 500.0}}), CONFIG, sensors)
    m.record_and_get_throttle_ms("ANONYMOUS", "client@#$%", 100, 0)
    assert [key for key, _ in sensors.entries(0)] == [("Produce", "", "client@#$%")]


def test_fetch_unrecord_leaves_the_sum_unchanged() -> None:
    # Section 11.15: a throttled fetch returns no data, so its bytes are taken back.
    m = ClientQuotaManager(F, QuotaStore({E(user=DEFAULT): {F: 1000.0}}), CONFIG, LocalSensors(CONFIG))
    assert m.record_and_get_throttle_ms("alice", "c", 4000, 0) == 0
    before = m.measure("alice", "c", 500)
    assert before == 4000 / 10.5
    assert m.record_and_get_throttle_ms("alice", "c", 20000, 500) == 13500  # 24000/10.5 vs 1000
    m.unrecord("alice", "c", 20000, 500)
    assert m.measure("alice", "c", 500) == before
    assert m.record_and_get_throttle_ms("alice", "c", 0, 500) == 0


def test_entity_cap_means_not_measured_and_not_throttled() -> None:
    sensors = LocalSensors(CONFIG, max_entities=1)
    m = ClientQuotaManager(P, QuotaStore({E(client_id=DEFAULT): {P: 500.0}}), CONFIG, sensors)
    assert m.record_and_get_throttle_ms("u", "a", 6000, 0) == 2000
    assert m.record_and_get_throttle_ms("u", "b", 6000, 0) == 0
    assert sensors.dropped == 1
    assert m.measure("u", "b", 0) == 0.0


def test_idle_sensor_expires_after_an_hour() -> None:
    sensors = LocalSensors(CONFIG)
    m = ClientQuotaManager(P, QuotaStore({E(client_id=DEFAULT): {P: 500.0}}), CONFIG, sensors)
    assert m.record_and_get_throttle_ms("u", "a", 6000, 0) == 2000
    first = sensors.get(("Produce", "", "a"), HOUR)
    assert first is not None
    assert sensors.entries(HOUR + 1) == []
    assert m.measure("u", "a", HOUR + 1) == 0.0
    assert m.record_and_get_throttle_ms("u", "a", 5000, HOUR + 1) == 0
    assert sensors.get(("Produce", "", "a"), HOUR + 1) is not first


def test_a_changed_quota_applies_to_the_live_sensor() -> None:
    store = QuotaStore({E(client_id="p1"): {P: 2000.0}})
    m = produce(store)
    assert m.record_and_get_throttle_ms("ANONYMOUS", "p1", 2500 * 11, 0) == 3750
    store.set(E(client_id="p1"), P, 3000.0)
    assert m.record_and_get_throttle_ms("ANONYMOUS", "p1", 0, 0) == 0
    store.set(E(client_id="p1"), P, 500.0)
    assert m.record_and_get_throttle_ms("ANONYMOUS", "p1", 0, 0) == 45000


def test_client_quota_manager_rejects_other_keys() -> None:
    for key in (M, C):
        with pytest.raises(ValueError):
            ClientQuotaManager(key, QuotaStore(), CONFIG, LocalSensors(CONFIG))


# --- ClientRequestQuotaManager --------------------------------------------------------------

def test_time_ms_to_percentage() -> None:
    assert time_ms_to_percentage(4) == 4 * 1000 * 1000 * (100.0 / 1e9)
    assert round(time_ms_to_percentage(4), 12) == 0.4
    assert time_ms_to_percentage(1000) == 100.0


def test_request_percentage_quota_violation() -> None:
    # Section 11.3 / ClientRequestQuotaManagerTest: <u, c> request quota 1 %.
    store = QuotaStore({E(user="ANONYMOUS", client_id="test-client"): {R: 1.0}})
    m = ClientRequestQuotaManager(store, CONFIG, LocalSensors(CONFIG))
    u, c = "ANONYMOUS", "test-client"
    t = 0
    for _ in range(10):
        assert m.record_and_get_throttle_ms(u, c, 4, t) == 0
        t += 1000
    # 4*10 + 67.1 = 107.1 ms over 10.5 s = 10.2 ms/s against 10: (10.2 - 10)/10 * 10500 = 210.
    t += 500
    throttle = m.record_and_get_throttle_ms(u, c, 67.1, t)
    assert throttle == 210
    t += throttle
    for _ in range(11):
        m.record_and_get_throttle_ms(u, c, 4, t)
        t += 1000
    assert m.record_and_get_throttle_ms(u, c, 0, t) == 0  # the burst has rolled over
    # A spike needing more than one window is capped at one window.
    assert m.record_and_get_throttle_ms(u, c, 500, t) == 1000
    for _ in range(10):
        t += 1000
        assert m.record_and_get_throttle_ms(u, c, 0, t) == 1000
    t += 1000
    assert m.record_and_get_throttle_ms(u, c, 0, t) == 0


def test_request_time_recorded_without_throttle_weighs_on_the_next_request() -> None:
    store = QuotaStore({E(client_id=DEFAULT): {R: 1.0}})
    m = ClientRequestQuotaManager(store, CONFIG, LocalSensors(CONFIG))
    m.record_no_throttle("u", "c", 50, 0)  # network-thread time: 5 percent-seconds
    assert m.measure("u", "c", 0) == 0.5
    assert m.record_and_get_throttle_ms("u", "c", 0, 0) == 0  # 0.5 % <= 1 %
    m.record_no_throttle("u", "c", 51, 0)
    assert m.record_and_get_throttle_ms("u", "c", 0, 0) == 100  # 1.01 %: (1.01 - 1)/1 * 10000
    m.record_no_throttle("u", "c", 100, 0)
    assert m.record_and_get_throttle_ms("u", "c", 0, 0) == 1000  # 2.01 %: 10100 ms, capped at W
    m2 = ClientRequestQuotaManager(store, MetricConfig(window_ms=2000), LocalSensors(CONFIG))
    assert m2.max_throttle_ms == 2000


def test_exempt_request_time_is_global_and_only_when_enabled() -> None:
    store = QuotaStore()
    m = ClientRequestQuotaManager(store, CONFIG, LocalSensors(CONFIG))
    m.record_exempt(1000, 0)
    assert m.exempt_request_time(0) == 0.0
    store.set(E(user=DEFAULT), R, 50.0)
    m.record_exempt(1000, 0)
    assert m.exempt_request_time(0) == 10.0  # 100 percent-seconds over 10 s


# --- Controller mutations -------------------------------------------------------------------

MUTATION_CONFIG = MetricConfig(samples=10, window_ms=1000)  # Q = 10 -> B = 100


def mutations(store: QuotaStore | None = None) -> ControllerMutationQuotaManager:
    store = store or QuotaStore({E(user="ANONYMOUS", client_id="test-client"): {M: 10.0}})
    return ControllerMutationQuotaManager(store, MUTATION_CONFIG, LocalSensors(MUTATION_CONFIG))


def test_strict_controller_mutation_quota() -> None:
    # Section 11.9 / StrictControllerMutationQuotaTest: one request, three records at T.
    q = mutations().new_quota_for("ANONYMOUS", "test-client", True, 0)
    assert isinstance(q, StrictControllerMutationQuota)
    assert not q.is_exceeded
    assert q.record(90, 0)  # tokens 100 -> 10
    assert (q.is_exceeded, q.throttle_time_ms(0)) == (False, 0)
    assert q.record(90, 0)  # 10 >= 0, accepted in full: tokens -80, and no throttle
    assert (q.is_exceeded, q.throttle_time_ms(0)) == (False, 0)
    assert not q.record(90, 0)  # below zero: rejected (error 89), not recorded
    assert (q.is_exceeded, q.throttle_time_ms(0)) == (True, 8000)
    assert q.throttle_time_ms(5000) == 3000  # the throttle shrinks with time


def test_permissive_controller_mutation_quota() -> None:
    # Section 11.10 / PermissiveControllerMutationQuotaTest: same inputs, never rejects.
    q = mutations().new_quota_for("ANONYMOUS", "test-client", False, 0)
    assert isinstance(q, PermissiveControllerMutationQuota)
    assert q.record(90, 0)
    assert (q.is_exceeded, q.throttle_time_ms(0)) == (False, 0)
    assert q.record(90, 0)
    assert (q.is_exceeded, q.throttle_time_ms(0)) == (False, 8000)
    assert q.record(90, 0)
    assert (q.is_exceeded, q.throttle_time_ms(0)) == (False, 17000)
    assert q.throttle_time_ms(5000) == 12000


def test_controller_mutation_quota_violation() -> None:
    # Section 11.11 / ControllerMutationQuotaManagerTest.testControllerMutationQuotaViolation
    m = mutations()
    u, c = "ANONYMOUS", "test-client"
    t = 0
    for _ in range(10):
        assert m.record_strict(u, c, 10, t) == (True, 0)
        t += 1000
    assert m.record_strict(u, c, 110, t) == (True, 0)  # 100 tokens: accepted, now -10
    assert m.tokens(u, c, t) == -10.0
    assert m.record_strict(u, c, 110, t) == (False, 1000)  # -10 / 10 per s = 1 s
    assert m.tokens(u, c, t) == -10.0  # a rejection records nothing
    t += 1000
    assert m.tokens(u, c, t) == 0.0
    assert m.record_strict(u, c, 110, t) == (True, 0)  # 0 is not below zero


def test_record_permissive() -> None:
    m = mutations()
    u, c = "ANONYMOUS", "test-client"
    assert m.record_permissive(u, c, 90, 0) == 0
    assert m.record_permissive(u, c, 90, 0) == 8000
    assert m.record_permissive(u, c, 90, 0) == 17000
    assert m.record_permissive(u, c, 0, 5000) == 12000
    assert m.record_strict(u, c, 1, 5000) == (False, 12000)


def test_controller_mutation_without_a_quota_is_unbounded() -> None:
    assert mutations(QuotaStore()).new_quota_for("u", "c", True, 0) is UNBOUNDED_CONTROLLER_MUTATION_QUOTA
    m = mutations()  # enabled, but no quota for this user
    q = m.new_quota_for("other", "c", True, 0)
    assert q is UNBOUNDED_CONTROLLER_MUTATION_QUOTA
    assert q.record(10**9, 0)
    assert (q.is_exceeded, q.throttle_time_ms(0)) == (False, 0)
    assert m.record_strict("other", "c", 10**9, 0) == (True, 0)
    assert m.tokens("other", "c", 0) is None


def test_controller_mutation_quota_change_applies_to_the_bucket() -> None:
    store = QuotaStore({E(user=DEFAULT): {M: 10.0}})
    m = mutations(store)
    assert m.record_permissive("u", "c", 150, 0) == 5000  # 100 - 150 = -50
    store.set(E(user=DEFAULT), M, 50.0)
    assert m.record_permissive("u", "c", 0, 0) == 1000  # -50 at 50/s
    assert m.tokens("u", "c", 1000) == 0.0
    assert m.quota("u", "c") == 50.0
    assert m.tags("u", "c") == ("u", "")


# --- Connection creation rate ---------------------------------------------------------------

CONN_CONFIG = MetricConfig(samples=2, window_ms=1000)  # ConnectionQuotasTest


def connections(store: QuotaStore) -> tuple[ConnectionQuotas, LocalSensors]:
    sensors = LocalSensors(CONN_CONFIG)
    return ConnectionQuotas(store, CONN_CONFIG, sensors), sensors


def accept(quotas: ConnectionQuotas, ip: str, n: int, now: int = 0) -> list[int]:
    return [quotas.on_accept(ip, now) for _ in range(n)]


def test_enforced_ip_connection_rate_quota_update() -> None:
    # Section 11.12 / ConnectionQuotasTest.testEnforcedIpConnectionRateQuotaUpdate, at one instant.
    store = QuotaStore({E(ip="10.0.0.1"): {C: 20.0}})
    quotas, sensors = connections(store)
    # 20 over the 1 s fresh window is the limit; the 21st is (21 - 20)/20 * 1000 = 50 ms, unrecorded.
    assert accept(quotas, "10.0.0.1", 40) == [0] * 20 + [50] * 20
    assert quotas.measure("10.0.0.1", 0) == 20.0
    store.set(E(ip="10.0.0.1"), C, 30.0)
    assert accept(quotas, "10.0.0.1", 40) == [0] * 10 + [33] * 30  # 30 in all; 31/30 -> 33 ms
    store.remove(E(ip="10.0.0.1"), C)
    assert quotas.connection_rate_for_ip("10.0.0.1") is None
    assert accept(quotas, "10.0.0.1", 40) == [0] * 40
    # Another IP, no quota: not even measured; then a default IP quota applies to it.
    assert accept(quotas, "10.0.0.2", 40) == [0] * 40
    assert sensors.get(("ip", "10.0.0.2"), 0) is None
    store.set(E(ip=DEFAULT), C, 20.0)
    assert quotas.connection_rate_for_ip("10.0.0.2") == 20
    assert accept(quotas, "10.0.0.2", 40) == [0] * 20 + [50] * 20


def test_ip_override_beats_the_default() -> None:
    quotas, _ = connections(QuotaStore({E(ip=DEFAULT): {C: 2.0}, E(ip="10.0.0.1"): {C: 4.0}}))
    assert accept(quotas, "10.0.0.1", 5) == [0, 0, 0, 0, 250]
    assert accept(quotas, "10.0.0.9", 3) == [0, 0, 500]


def test_zero_ip_connection_rate_throttles_the_first_connection_for_a_window() -> None:
    quotas, _ = connections(QuotaStore({E(ip="10.0.0.1"): {C: 0.0}}))
    assert accept(quotas, "10.0.0.1", 3) == [1000, 1000, 1000]
    assert quotas.measure("10.0.0.1", 0) == 0.0


def test_throttle_is_capped_at_one_window() -> None:
    quotas, _ = connections(QuotaStore({E(ip=DEFAULT): {C: 1.0}}))
    assert accept(quotas, "10.0.0.1", 3) == [0, 1000, 1000]


def test_int_max_ip_limit_is_not_enforced() -> None:
    quotas, sensors = connections(QuotaStore({E(ip=DEFAULT): {C: float(2**31 - 1)}}))
    assert quotas.connection_rate_for_ip("10.0.0.1") is None
    assert quotas.on_accept("10.0.0.1", 0) == 0
    assert len(sensors) == 0


def test_connections_are_let_in_again_as_the_window_moves() -> None:
    quotas, _ = connections(QuotaStore({E(ip=DEFAULT): {C: 2.0}}))
    assert accept(quotas, "10.0.0.1", 3, 0) == [0, 0, 500]
    # At 1500 the window is 1.5 s: a third connection makes 3/1.5 = 2/s, not above the limit;
    # a fourth makes 2.67/s: (2.67 - 2)/2 * 1500 = 500 ms.
    assert accept(quotas, "10.0.0.1", 2, 1500) == [0, 500]


def test_ip_addresses_are_normalized() -> None:
    assert normalize_ip("::ffff:10.0.0.1") == "10.0.0.1"
    assert normalize_ip("2001:DB8:0:0::1") == "2001:db8::1"
    assert normalize_ip("broker.example") == "broker.example"
    quotas, _ = connections(QuotaStore({E(ip="::FFFF:10.0.0.1"): {C: 1.0}}))
    assert quotas.on_accept("10.0.0.1", 0) == 0
    assert quotas.on_accept("::ffff:10.0.0.1", 0) == 1000  # the same IP


def test_connection_entity_cap() -> None:
    sensors = LocalSensors(CONN_CONFIG, max_entities=1)
    quotas = ConnectionQuotas(QuotaStore({E(ip=DEFAULT): {C: 1.0}}), CONN_CONFIG, sensors)
    assert accept(quotas, "10.0.0.1", 2) == [0, 1000]
    assert accept(quotas, "10.0.0.2", 2) == [0, 0]  # not measured
    assert sensors.dropped == 2
    assert isinstance(sensors.get(("ip", "10.0.0.1"), 0), Rate)


# --- ChargeHandle: a connection's kept way to its sensor ------------------------------------

@pytest.mark.parametrize("seed", range(10))
def test_charging_through_kept_handles_is_the_same_as_looking_up(seed: int) -> None:
    """Two managers on one store, one charged through per-connection handles, one by looking
    each request up: over random clients, principals changing, quotas changing and sensors
    expiring (a short expiry) or dropped at the entity cap, every throttle and rate agrees."""
    import random

    rnd = random.Random(seed)
    store = QuotaStore({E(client_id=DEFAULT): {P: 5000.0}})
    kept = produce(store, max_entities=4, expiry_ms=3000)
    plain = produce(store, max_entities=4, expiry_ms=3000)
    # A connection: its handles, its principal, its client-id (either changes now and then).
    connections: list[tuple[dict[object, object], list[str | None]]] = [
        ({}, ["ANONYMOUS", f"c{i % 3}"]) for i in range(6)]
    now = 0
    for _ in range(4000):
        now += rnd.choice([0, 1, 7, 100, 250, 4000 if rnd.random() < 0.02 else 0])
        if rnd.random() < 0.01:
            store.set(E(client_id=f"c{rnd.randrange(3)}"), P, float(rnd.choice([1000, 20000])))
        if rnd.random() < 0.005:
            store.set(E(user="alice"), P, 3000.0)
        handles, who = rnd.choice(connections)
        if rnd.random() < 0.03:
            who[0] = rnd.choice(["ANONYMOUS", "alice", "bob"])
        if rnd.random() < 0.03:
            who[1] = rnd.choice(["c0", "c1", "c2", "other", None])
        user, client = who
        assert user is not None
        value = rnd.choice([100, 1000, 10_000])
        expected = plain.record_and_get_throttle_ms(user, client, value, now)
        assert kept.record_and_get_throttle_ms(user, client, value, now, handles) == expected
        assert kept.measure(user, client, now) == plain.measure(user, client, now)
    assert kept.sensors.dropped == plain.sensors.dropped > 0


def test_a_kept_handle_is_dropped_when_its_sensor_is_gone() -> None:
    store = QuotaStore({E(client_id=DEFAULT): {P: 100.0}})
    m = produce(store, expiry_ms=1000)
    handles: dict[object, object] = {}
    m.record_and_get_throttle_ms("ANONYMOUS", "app", 500, 0, handles)
    first = handles[m]
    m.sensors.remove(("Produce", "", "app"))
    # A fresh sensor (counters from zero), not the removed one: 500 B over 10 s = 50 B/s.
    assert m.record_and_get_throttle_ms("ANONYMOUS", "app", 500, 10, handles) == 0
    assert handles[m] is not first and m.measure("ANONYMOUS", "app", 10) == 50.0
    # Expired (idle for more than 1 s): again a fresh one.
    second = handles[m]
    assert m.record_and_get_throttle_ms("ANONYMOUS", "app", 500, 2000, handles) == 0
    assert handles[m] is not second and m.measure("ANONYMOUS", "app", 2000) == 50.0


def test_pace_is_for_the_clients_own_quota_and_zero_without_one() -> None:
    store = QuotaStore({E(client_id="c"): {F: 1000.0}})
    m = ClientQuotaManager(F, store, CONFIG, LocalSensors(CONFIG))
    assert m.pace_ms("u", "c", 500, 0) == 0  # nothing recorded yet: no sensor to pace on
    assert m.record_and_get_throttle_ms("u", "c", 20_000, 0) > 0
    assert m.pace_ms("u", "c", 500, 0) == 500
    assert m.pace_ms("u", "c", 500, 100) == 900
    m.record_and_get_throttle_ms("u", "other", 20_000, 0)
    assert m.pace_ms("u", "other", 500, 100) == 0  # no quota applies to it
    assert ClientQuotaManager(F, QuotaStore(), CONFIG, LocalSensors(CONFIG)).pace_ms("u", "c", 500, 0) == 0
