"""proxy/quota_runtime/engine.py: the one call a quota stage makes to learn whether and when a request is
charged (`charging`, `settling`), the one that counts a throttle (`throttled`), and a Produce
charged in one call (`ClientQuotaManager.charge`)."""

from __future__ import annotations

from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine, Switches
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import registered
from kafka_quota_proxy.quota.managers import ChargeHandle, ClientQuotaManager, ClientRequestQuotaManager
from kafka_quota_proxy.quota.mutations import ControllerMutationQuotaManager
from kafka_quota_proxy.quota.producer_ids import ProducerIdQuotaManager
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.shared import ScopedShared
from tests.support.kinds import LIST_GROUPS_RATE
from tests.support.managers import produce_bytes

QUOTA = 1_000_000.0


def engine(quotas: bool = True, **settings: object) -> tuple[QuotaEngine, list[int]]:
    now = [5_000]
    store = QuotaStore({QuotaEntity(client_id="c"): {QuotaKey.PRODUCER_BYTE_RATE: QUOTA}} if quotas else {})
    return QuotaEngine(QuotaSettings(**settings), store, clock=lambda: now[0]), now  # type: ignore[arg-type]


class Heard:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, int]] = []

    def throttled(self, user: str, client_id: str, quota_type: str, throttle_ms: int) -> None:
        self.calls.append((user, client_id, quota_type, throttle_ms))


def test_a_request_is_charged_with_the_switches_and_the_time_in_one_call() -> None:
    e, now = engine()
    now[0] = 7_000
    charging = e.charging("alice", "c")
    assert charging is not None
    switches, now = charging
    assert now == 7_000 and switches.charging and switches.enforcing
    assert e.settling() == (switches, 7_000)


def test_nothing_is_charged_before_any_quota_in_mode_off_or_for_the_exempt() -> None:
    assert engine(quotas=False)[0].charging("alice", "c") is None
    assert engine(mode="off")[0].charging("alice", "c") is None
    exempt = engine(exempt_principals=frozenset({"ops"}), exempt_client_ids=frozenset({"probe"}))[0]
    assert exempt.charging("ops", "c") is None
    assert exempt.charging("alice", "probe") is None
    assert exempt.charging("alice", "c") is not None
    observing = engine(mode="observe")[0].charging("alice", "c")
    assert observing is not None and not observing[0].enforcing


def test_a_throttle_is_counted_and_told_to_the_usage_log_and_held_only_when_enforcing() -> None:
    e, _ = engine()
    heard = Heard()
    e.usage = heard
    assert e.throttled("produce", "alice", "c", 250, 5_000) is True
    assert e.throttled("producer_ids", "alice", "c", 40, 5_000, per_user=True) is True
    assert {k: (r.count, r.total_ms) for k, r in e.throttles.records.items()} == {
        ("produce", "alice", "c"): (1, 250), ("producer_ids", "alice", ""): (1, 40)}
    assert heard.calls == [("alice", "c", "produce", 250), ("alice", "c", "producer_ids", 40)]
    observing, _ = engine(mode="observe")
    assert observing.throttled("produce", "alice", "c", 250, 5_000) is False
    assert observing.throttles.records[("produce", "alice", "c")].count == 1


def test_a_produce_charged_in_one_call_says_when_to_read_one_request_at_a_time() -> None:
    e, _ = engine()
    manager = produce_bytes(e.scope("broker"))
    handles: dict[object, ChargeHandle] = {}
    # Within the quota so far: no throttle, reads ahead.
    assert manager.charge("alice", "c", 1_000, 5_000, handles) == (0, False)
    # A window's worth at once: throttled, and read alone until the answer has gone.
    throttle_ms, alone = manager.charge("alice", "c", 30_000_000, 5_010, handles)
    assert throttle_ms > 0 and alone
    # Paced: held for the bytes' time at the quota less the first allowance ((N-1) W = 10 s:
    # 30 s - 10 s), the requests waiting for their turns rather than read alone.
    paced = produce_bytes(engine()[0].scope("broker"))
    assert paced.charge("alice", "c", 30_000_000, 5_000, {}, paced=True) == (20_000, False)
    # The client-id with no quota: nothing.
    assert manager.charge("alice", "other", 30_000_000, 5_030, handles) == (0, False)


def test_a_scope_has_the_manager_each_kind_declares_and_a_topic_manager_for_each_topic_kind() -> None:
    q = engine()[0].scope("broker")
    assert {key: type(manager) for key, manager in q.clients.items()} == {
        QuotaKey.PRODUCER_BYTE_RATE: ClientQuotaManager, QuotaKey.CONSUMER_BYTE_RATE: ClientQuotaManager,
        QuotaKey.REQUEST_PERCENTAGE: ClientRequestQuotaManager,
        QuotaKey.CONTROLLER_MUTATION_RATE: ControllerMutationQuotaManager,
        QuotaKey.PRODUCER_IDS_RATE: ProducerIdQuotaManager}  # connections: one per proxy, not per scope
    assert {key: manager.key for key, manager in q.topics.items()} == {
        QuotaKey.PRODUCER_BYTE_RATE: QuotaKey.PRODUCER_BYTE_RATE,
        QuotaKey.CONSUMER_BYTE_RATE: QuotaKey.CONSUMER_BYTE_RATE}
    rates = [(key, m) for key, m in q.clients.items() if isinstance(m, ClientQuotaManager)]
    assert all(manager.key == key for key, manager in rates)


def test_a_registered_kind_gets_a_rate_manager_in_scopes_made_after_it() -> None:
    before = engine()[0].scope("broker")
    with registered(LIST_GROUPS_RATE):
        e = engine()[0]
        manager = e.scope("broker").rates[LIST_GROUPS_RATE.key]
        assert type(manager) is ClientQuotaManager and manager.key == LIST_GROUPS_RATE.key
    assert LIST_GROUPS_RATE.key not in before.clients


def test_with_a_store_the_byte_rates_mutations_and_their_topics_are_shared_under_their_names() -> None:
    e = QuotaEngine(QuotaSettings(), QuotaStore({}), clock=lambda: 0, shared_buckets=4)
    shared = e.scope("b:1")
    with registered(LIST_GROUPS_RATE):
        counted = e.scope("b:2").rates[LIST_GROUPS_RATE.key]
    def shared_as(manager: object) -> str | None:
        if isinstance(manager, ProducerIdQuotaManager):
            manager = manager.rate
        stats = getattr(manager, "stats", None)
        return stats.kind if isinstance(stats, ScopedShared) else None

    assert {key: shared_as(m) for key, m in shared.clients.items()} == {
        QuotaKey.PRODUCER_BYTE_RATE: "produce", QuotaKey.CONSUMER_BYTE_RATE: "fetch",
        QuotaKey.REQUEST_PERCENTAGE: None, QuotaKey.CONTROLLER_MUTATION_RATE: "mutation",
        QuotaKey.PRODUCER_IDS_RATE: "pids"}
    assert shared_as(counted) is None  # a registered kind is measured per process
    assert [shared_as(m) for m in shared.topics.values()] == ["topic-produce", "topic-fetch"]
    assert shared_as(QuotaEngine(QuotaSettings(), QuotaStore({}), clock=lambda: 0).scope("b:1").rates[
        QuotaKey.PRODUCER_BYTE_RATE]) is None  # no store: this process alone


def test_the_switches_name_the_kinds_and_topic_kinds_ever_configured_and_topics_only_when_active() -> None:
    def switches(mode: str) -> Switches:
        store = QuotaStore({QuotaEntity(client_id="c"): {QuotaKey.PRODUCER_BYTE_RATE: QUOTA},
                            QuotaEntity(user="u"): {QuotaKey.PRODUCER_IDS_RATE: 1.0},
                            QuotaEntity(topic="t"): {QuotaKey.CONSUMER_BYTE_RATE: QUOTA}})
        return QuotaEngine(QuotaSettings(mode=mode), store, clock=lambda: 0).switches()  # type: ignore[arg-type]

    enforce, off = switches("enforce"), switches("off")
    assert enforce.enabled == off.enabled == {QuotaKey.PRODUCER_BYTE_RATE, QuotaKey.PRODUCER_IDS_RATE}
    assert enforce.topics == {QuotaKey.CONSUMER_BYTE_RATE} and off.topics == frozenset()
    assert enforce.charging and not off.charging and off.measuring
    none = engine(quotas=False)[0].switches()
    assert none.enabled == none.topics == frozenset() and not none.measuring
