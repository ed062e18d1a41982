"""The proxy's quota managers, per measurement scope, and what they have throttled.

Scope `broker` keeps one set of managers per upstream broker (the broker address a client
connection forwards to, whichever listener it came in on), so the same quota settings behave as
they would on each Kafka broker. Scope `proxy` keeps
one set for everything behind this proxy instance. The managers themselves are the pure ones in
`quota/`; this module only feeds them the time and remembers throttles for the metrics.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.quota.connections import ConnectionQuotas
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.kinds import QuotaKind, kinds, tenant_kinds, topic_keys
from kafka_quota_proxy.quota.managers import ClientQuotaManager, ClientRequestQuotaManager
from kafka_quota_proxy.quota.mutations import ControllerMutationQuotaManager
from kafka_quota_proxy.quota.producer_ids import ProducerIdCache, ProducerIdQuotaManager
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.resolution import QuotaStore, sanitize_user
from kafka_quota_proxy.quota.sensors import LocalSensors, StatFactory
from kafka_quota_proxy.quota.shared import ScopedShared, SharedIds, SharedQuotas
from kafka_quota_proxy.quota.topics import Leadership, TopicQuotaManager

EXPIRY_MS = 3_600_000  # Kafka expires idle quota sensors after an hour


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Switches:
    """QuotaEngine.switches: what decides how (and whether) a request is charged."""

    version: int  # the quota store's version they were made at
    settings: QuotaSettings  # and the settings
    measuring: bool  # some client quota has ever been configured (QuotaEngine.measuring)
    charging: bool  # measuring, and the mode is not "off"
    # The tenant kinds some client quota of has ever been configured (Kafka's sticky per-type
    # flags): a kind's stage visits its manager only then.
    enabled: frozenset[QuotaKey]
    exempting: bool  # exempt principals or client-ids are listed
    # The topic kinds some topic's quota of has ever been configured, in modes enforce and observe.
    topics: frozenset[QuotaKey]
    paced: bool  # quota.byte_rate_enforcement: paced (Pacer.pace), not Kafka's throttle
    enforcing: bool  # mode enforce: a throttle holds the client (else it is only counted)


# What a quota stage needs to charge one request, from one call (`QuotaEngine.charging`): the
# switches and the engine's time (ms). A plain tuple: one is made for every charged request.
Charging = tuple[Switches, int]


class ThrottleListener(Protocol):
    """Told of every throttle the engine counts (the usage log's meter)."""

    def throttled(self, user: str, client_id: str, quota_type: str, throttle_ms: int) -> None: ...


# What measures one kind in a scope (QuotaKind.manager says which).
Manager = ClientQuotaManager | ControllerMutationQuotaManager | ProducerIdQuotaManager
M = TypeVar("M", ClientQuotaManager, ClientRequestQuotaManager, ControllerMutationQuotaManager,
            ProducerIdQuotaManager)


@dataclass
class ScopeManagers:
    """The managers of one measurement scope, one per kind known when the scope was first used
    (quota/kinds.py): each tenant kind's by its key, and each topic kind's."""

    clients: dict[QuotaKey, Manager]
    topics: dict[QuotaKey, TopicQuotaManager]
    # The clients that are Kafka's ClientQuotaManager (a byte rate, request time, a request-rate
    # kind's), typed, for the stages that charge them on every request.
    rates: dict[QuotaKey, ClientQuotaManager] = field(init=False)

    def __post_init__(self) -> None:
        self.rates = {key: m for key, m in self.clients.items() if isinstance(m, ClientQuotaManager)}

    def of(self, key: QuotaKey, manager: type[M]) -> M:
        """The manager of `key`, which the kind declares to be a `manager`."""
        return cast(M, self.clients[key])


@dataclass(slots=True)
class ThrottleRecord:
    """How often and how long one entity was throttled, for the metrics."""

    count: int = 0
    total_ms: int = 0
    last_ms: int = 0  # clock time of the last throttle, for expiry


@dataclass
class ThrottleStats:
    """Throttles applied (or, in observe mode, that would have been) per quota type and entity."""

    max_entities: int
    records: dict[tuple[str, str, str], ThrottleRecord] = field(default_factory=dict)
    dropped: int = 0

    def add(self, quota_type: str, user: str, client_id: str, throttle_ms: int, now_ms: int) -> None:
        key = (quota_type, user, client_id)
        rec = self.records.get(key)
        if rec is None:
            if len(self.records) >= self.max_entities:
                self.dropped += 1
                return
            rec = self.records[key] = ThrottleRecord()
        rec.count += 1
        rec.total_ms += throttle_ms
        rec.last_ms = now_ms

    def expire(self, now_ms: int) -> None:
        for key in [k for k, r in self.records.items() if now_ms - r.last_ms >= EXPIRY_MS]:
            del self.records[key]


class QuotaEngine:
    """Everything quota-related the proxy holds: configured quotas, managers, switches."""

    def __init__(self, settings: QuotaSettings, store: QuotaStore,
                 clock: Callable[[], int] = monotonic_ms, shared_buckets: int | None = None,
                 share_proxy_scope: bool = False, leadership: Leadership | None = None,
                 broker_count: Callable[[], int] = lambda: 1) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.config = MetricConfig(samples=settings.window_num, window_ms=settings.window_ms)
        pid = settings.producer_ids
        self.producer_id_config = MetricConfig(samples=pid.window_num, window_ms=pid.window_ms)
        # Who leads each topic's partitions (from the Metadata the proxy sees): topic quotas
        # split a topic's budget by it. `broker_count`: the brokers known, for the even split
        # while a topic's leaders are not known.
        self.leadership = leadership if leadership is not None else Leadership()
        self.broker_count = broker_count
        # With a shared store (`store:`), byte rates and controller mutations of scopes `broker`
        # and `cluster` are measured across replicas (docs/cluster-quotas.md); None: this
        # process alone.
        self.shared: SharedQuotas | None = None
        # Scope `proxy` is one process's budget, but the workers of one --workers proxy share it.
        self.share_proxy_scope = share_proxy_scope
        # Producer-id rates have their own windows (an hour), so their own registry; and the ids
        # counted here, to be checked against the other replicas'.
        self.shared_id_rates: SharedQuotas | None = None
        self.shared_ids: SharedIds | None = None
        if shared_buckets:
            self.shared = SharedQuotas(self.config, shared_buckets)
            self.shared_id_rates = SharedQuotas(self.producer_id_config, shared_buckets, self.shared.clock)
            self.shared_ids = SharedIds(self.producer_id_config.window_ms, self.shared.clock)
        # A secret seed per process: a client cannot choose producer ids whose filter bits are
        # already set, to pass as seen.
        self.producer_id_seed = secrets.randbits(32)
        self._scopes: dict[str, ScopeManagers] = {}
        self._sensors: list[LocalSensors] = []
        self.connections = ConnectionQuotas(store, self.config, self._new_sensors())
        self.throttles = ThrottleStats(settings.max_tracked_entities)
        self._switches: Switches | None = None
        self.connection_throttles = ThrottleStats(settings.max_tracked_entities)
        # Topic quotas' throttles, keyed (quota type, topic, ""): a topic, not a client, is held.
        self.topic_throttles = ThrottleStats(settings.max_tracked_entities)
        # The usage log's meter, told of every throttle; None when the usage log is off.
        self.usage: ThrottleListener | None = None

    def _new_sensors(self) -> LocalSensors:
        sensors = LocalSensors(self.config, max_entities=self.settings.max_tracked_entities,
                               expiry_ms=EXPIRY_MS)
        self._sensors.append(sensors)
        return sensors

    # -- switches, changeable at run time ---------------------------------------------------------

    def update(self, settings: QuotaSettings) -> list[str]:
        """Apply new switches; return the names of settings that need a restart to change."""
        # state_file too: the quota control keeps writing where it read at start.
        fixed = ("scope", "window_num", "window_size_seconds", "max_tracked_entities", "state_file")
        needs_restart = [name for name in fixed if getattr(settings, name) != getattr(self.settings, name)]
        old_ids, new_ids = self.settings.producer_ids, settings.producer_ids
        shape = old_ids.SHAPE
        needs_restart += [f"producer_ids.{n}" for n in shape if getattr(new_ids, n) != getattr(old_ids, n)]
        # The measurement's shape stays as started; everything else (the producer-id action
        # among it) applies at once.
        producer_ids = dataclasses.replace(new_ids, **{n: getattr(old_ids, n) for n in shape})
        self.settings = dataclasses.replace(settings, producer_ids=producer_ids,
                                            **{n: getattr(self.settings, n) for n in fixed})
        return needs_restart

    @property
    def active(self) -> bool:
        return self.settings.mode != "off"

    @property
    def enforcing(self) -> bool:
        return self.settings.mode == "enforce"

    @property
    def measuring(self) -> bool:
        """False until some client quota has ever been configured (Kafka's sticky per-type
        flags): until then the managers record nothing, so requests need not visit them."""
        return self.switches().measuring

    def switches(self) -> Switches:
        """What every request asks before it is charged, in one call. Made again only when the
        quotas (the store's version) or the settings change."""
        found = self._switches
        store, settings = self.store, self.settings
        if found is None or found.version != store.version or found.settings is not settings:
            enabled = frozenset(kind.key for kind in tenant_kinds() if store.quota_types_enabled(kind.key))
            active = settings.mode != "off"
            topics = frozenset(key for key in topic_keys() if active and store.topic_quotas_enabled(key))
            found = self._switches = Switches(
                version=store.version, settings=settings, measuring=bool(enabled),
                charging=bool(enabled) and active, enabled=enabled,
                exempting=bool(settings.exempt_principals or settings.exempt_client_ids), topics=topics,
                paced=settings.byte_rate_enforcement == "paced",
                enforcing=settings.mode == "enforce")
        return found

    def charging(self, principal: str, client_id: str) -> Charging | None:
        """Whether a request of `principal` and `client_id` is charged, and if so the switches
        and the time, in one call: None while no client quota has ever been configured, in mode
        off, or for an exempt principal or client-id."""
        switches = self.switches()
        if not switches.charging or (switches.exempting and self.exempt(principal, client_id)):
            return None
        return switches, self.clock()

    def settling(self) -> Charging:
        """The switches and the time to settle the response of a request charged earlier, in one
        call, whatever has changed since."""
        return self.switches(), self.clock()

    def throttled(self, quota_type: str, user: str, client_id: str, throttle_ms: int, now_ms: int,
                  per_user: bool = False) -> bool:
        """Count a throttle for the metrics and the usage log; whether the client is to be held
        for it (mode enforce). `per_user`: the quota is the user's alone (producer ids), counted
        without a client-id."""
        self.throttles.add(quota_type, sanitize_user(user), "" if per_user else client_id,
                           throttle_ms, now_ms)
        if self.usage is not None:
            self.usage.throttled(user, client_id, quota_type, throttle_ms)
        return self.enforcing

    def exempt(self, principal: str, client_id: str | None) -> bool:
        s = self.settings
        return principal in s.exempt_principals or (client_id or "") in s.exempt_client_ids

    # -- managers ---------------------------------------------------------------------------------

    def scope(self, broker: str) -> ScopeManagers:
        scope = self.settings.scope
        key = broker if scope == "broker" else scope
        found = self._scopes.get(key)
        if found is None:
            found = self._scopes[key] = self._scope_managers(key)
        return found

    def _scope_managers(self, scope: str) -> ScopeManagers:
        """A manager for each kind known (QuotaKind.manager), and a topic manager for each kind
        a topic may carry; ip kinds are the engine's own (`connections`), one per proxy."""
        builders: dict[str, Callable[[QuotaKind, str], Manager]] = {
            "rate": self._rate_manager, "request_time": self._request_manager,
            "token_bucket": self._mutation_manager, "producer_ids": self._producer_id_manager}
        clients: dict[QuotaKey, Manager] = {}
        topics: dict[QuotaKey, TopicQuotaManager] = {}
        for kind in kinds():
            if kind.manager != "connections":
                clients[kind.key] = builders[kind.manager](kind, scope)
            if kind.topic:
                topics[kind.key] = self._topic_manager(kind, scope)
        return ScopeManagers(clients, topics)

    def _rate_manager(self, kind: QuotaKind, scope: str) -> ClientQuotaManager:
        return ClientQuotaManager(kind.key, self.store, self.config, self._new_sensors(),
                                  self._stats(kind.shared, scope))

    def _request_manager(self, kind: QuotaKind, scope: str) -> ClientRequestQuotaManager:
        return ClientRequestQuotaManager(self.store, self.config, self._new_sensors())

    def _mutation_manager(self, kind: QuotaKind, scope: str) -> ControllerMutationQuotaManager:
        return ControllerMutationQuotaManager(self.store, self.config, self._new_sensors(),
                                              self._stats(kind.shared, scope))

    def _topic_manager(self, kind: QuotaKind, scope: str) -> TopicQuotaManager:
        """Scope `broker` allows a topic the share of the partitions its broker leads; `proxy`
        and `cluster` the whole budget."""
        broker = scope if self.settings.scope == "broker" else None
        stats = self._stats(f"topic-{kind.shared}" if kind.shared else "", scope)
        return TopicQuotaManager(kind.key, self.store, self.config, self._new_sensors(), self.leadership,
                                 broker, self.broker_count, stats)

    def _shares(self, scope: str) -> bool:
        """Whether a scope's measurements go to the store: scope `proxy` is one process's
        budget, unless the processes are the workers of one --workers proxy."""
        return scope != "proxy" or self.share_proxy_scope

    def _stats(self, kind: str, scope: str) -> StatFactory | None:
        if not kind or self.shared is None or not self._shares(scope):
            return None
        return ScopedShared(self.shared, kind, scope)

    def _producer_id_manager(self, kind: QuotaKind, scope: str) -> ProducerIdQuotaManager:
        s = self.settings.producer_ids
        cache = ProducerIdCache(s.window_ms, s.expected_ids_per_window, s.false_positive_rate, s.max_users,
                                s.max_bits_per_user, self.producer_id_seed)
        sensors = LocalSensors(self.producer_id_config, max_entities=self.settings.max_tracked_entities,
                               expiry_ms=max(EXPIRY_MS, s.window_num * s.window_ms))
        self._sensors.append(sensors)
        shared = self.shared_id_rates
        if shared is None or not self._shares(scope):
            return ProducerIdQuotaManager(self.store, self.producer_id_config, sensors, cache)
        return ProducerIdQuotaManager(self.store, self.producer_id_config, sensors, cache,
                                      ScopedShared(shared, kind.shared, scope), self.shared_ids)

    def producer_id_managers(self) -> Iterator[tuple[str, ProducerIdQuotaManager]]:
        """Each scope's producer-id manager (KIP-936), with the scope's name."""
        for scope, managers in self._scopes.items():
            for manager in managers.clients.values():
                if isinstance(manager, ProducerIdQuotaManager):
                    yield scope, manager

    def tracks_producer_ids(self) -> bool:
        """Whether any scope's seen-id cache holds a user (its cleanup then has work)."""
        return any(len(m.cache) for _, m in self.producer_id_managers())

    def expire_producer_ids(self) -> None:
        now = self.clock()
        for _, manager in self.producer_id_managers():
            manager.expire(now)

    def scopes(self) -> Iterator[tuple[str, ScopeManagers]]:
        yield from self._scopes.items()

    def dropped_entities(self) -> int:
        return (sum(s.dropped for s in self._sensors) + self.throttles.dropped
                + self.connection_throttles.dropped + self.topic_throttles.dropped)

    def expire(self) -> None:
        now = self.clock()
        for sensors in self._sensors:
            sensors.expire(now)
        self.throttles.expire(now)
        self.connection_throttles.expire(now)
        self.topic_throttles.expire(now)
