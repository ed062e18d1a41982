"""Topic quotas: a topic's write or read budget, split over the brokers that lead its partitions,
as the KIP-13 draft's "quota distribution" designed it and Kafka never shipped.

A topic entity (`topic: orders`, or `topic: <default>` for every topic without its own) carries
`producer_byte_rate` and `consumer_byte_rate`. Measured per upstream broker (scope `broker`), a
broker that leads L of the topic's P partitions allows the topic Q * L / P, whichever partitions
the traffic goes to; measured for the whole proxy (scopes `proxy` and `cluster`) the topic has Q.
The rate, the window and the throttle formula are Kafka's, as for every quota here.

What a throttle does is the stages' business (proxy/stages/topic_quotas.py): a Fetch answers the
topic's partitions empty (`record`, then `unrecord`, as Kafka takes back a throttled fetch), a
Produce refuses them (`admit`). This module only measures and decides.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from kafka_quota_proxy.quota.entities import DEFAULT, QuotaKey
from kafka_quota_proxy.quota.kinds import kind_of, topic_keys
from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.sensors import LocalStats, Sensors, StatFactory
from kafka_quota_proxy.quota.throttle import INT_MAX, rate_throttle_time_ms


class Leadership:
    """Which broker leads how many of each topic's partitions, as the last Metadata response
    that described the topic said. Brokers are named by the key the quota scope uses (the
    upstream broker's address); topic ids (Produce v13+, Fetch v13+) map back to names."""

    __slots__ = ("_leads", "_partitions", "_names", "version")

    def __init__(self) -> None:
        self._leads: dict[str, dict[str, int]] = {}  # topic -> broker -> partitions it leads
        self._partitions: dict[str, int] = {}  # topic -> partition count
        self._names: dict[bytes, str] = {}  # topic id -> name
        self.version = 0  # grows when any topic's split changes

    def observe(self, topic: str, leaders: Iterable[str | None], topic_id: bytes | None = None) -> None:
        """One topic from a Metadata response: the leader of each partition (None while it has
        none). A partition without a leader counts in the topic's partitions, so its part of the
        budget is nobody's until it has a leader again: the draft's split, not a bigger one."""
        counts: dict[str, int] = {}
        total = 0
        for leader in leaders:
            total += 1
            if leader is not None:
                counts[leader] = counts.get(leader, 0) + 1
        if topic_id is not None and any(topic_id):
            self._names[topic_id] = topic
        if self._leads.get(topic) != counts or self._partitions.get(topic) != total:
            self._leads[topic] = counts
            self._partitions[topic] = total
            self.version += 1

    def forget(self, topic: str) -> None:
        """The topic is gone (deleted, or Metadata says it is unknown)."""
        if topic in self._leads:
            del self._leads[topic]
            del self._partitions[topic]
            self.version += 1
        for topic_id in [i for i, name in self._names.items() if name == topic]:
            del self._names[topic_id]

    def share(self, topic: str, broker: str) -> float | None:
        """The broker's part of the topic's budget, L / P; None while the topic is not known
        (no Metadata has described it yet)."""
        total = self._partitions.get(topic)
        if not total:
            return None
        return self._leads[topic].get(broker, 0) / total

    def named(self, name: str | None, topic_id: bytes | None) -> str | None:
        """A message's topic by name: its own, or its id's (v13+ name topics by id); None for an
        id no Metadata has named yet."""
        if name is not None:
            return name
        return self._names.get(topic_id) if topic_id is not None else None

    def partitions(self, topic: str) -> int | None:
        return self._partitions.get(topic)


@dataclass(frozen=True, slots=True)
class TopicCharge:
    """What charging one topic's bytes decided: a throttle (0: within its budget) and the bound
    it was measured against (None: the topic has no quota)."""

    throttle_ms: int
    bound: float | None


UNLIMITED = TopicCharge(0, None)


class TopicQuotaManager:
    """One topic quota key (`producer_byte_rate` or `consumer_byte_rate` on topic entities) in
    one measurement scope: a Kafka `Rate` per topic and its bound, Q or Q * L / P.

    `broker` is the scope's broker (None for scopes `proxy` and `cluster`, which have the whole
    Q). Where the split is not known, the bound is Q / `brokers()`, the even split, until a
    Metadata response says better: a topic no Metadata has described yet, and bytes at a broker
    that the last Metadata said leads none of the topic's partitions (that Metadata is stale: a
    broker answers NOT_LEADER_OR_FOLLOWER for a partition it does not lead, so the bytes it takes
    are for partitions whose leadership has just moved to it).
    """

    def __init__(self, key: QuotaKey, store: QuotaStore, config: MetricConfig, sensors: Sensors,
                 leadership: Leadership, broker: str | None, brokers: Callable[[], int] = lambda: 1,
                 stats: StatFactory | None = None) -> None:
        if key not in topic_keys():
            raise ValueError(f"{key.value} is not a topic quota")
        self.key = key
        self.quota_type = kind_of(key).topic_sensor  # "TopicProduce" beside Kafka's "Produce"
        self.store = store
        self.config = config
        self.sensors = sensors
        self.leadership = leadership
        self.broker = broker
        self.brokers = brokers
        self.stats: StatFactory = stats if stats is not None else LocalStats(config)
        self._version = -1
        self._quotas: dict[str, float] = {}
        self._default: float | None = None

    @property
    def enabled(self) -> bool:
        """Sticky, as Kafka's per-key flags: a topic quota of this key was ever configured."""
        return self.store.topic_quotas_enabled(self.key)

    def _refresh(self) -> None:
        store = self.store
        if store.version == self._version:
            return
        quotas: dict[str, float] = {}
        default = None
        for entity, value in store.items_for(self.key):
            if entity.topic is None:
                continue
            if entity.topic == DEFAULT:
                default = value
            else:
                quotas[entity.topic] = value
        self._quotas, self._default = quotas, default
        self._version = store.version

    def quota(self, topic: str) -> float | None:
        """The topic's configured Q: its own, else `<default>`'s; None: unlimited."""
        self._refresh()
        return self._quotas.get(topic, self._default)

    def bound(self, topic: str) -> float | None:
        """What this scope allows the topic per second."""
        quota = self.quota(topic)
        if quota is None or self.broker is None:
            return quota
        share = self.leadership.share(topic, self.broker)
        if not share:
            return quota / max(self.brokers(), 1)
        return quota * share

    def _sensor_key(self, topic: str) -> Hashable:
        return (self.quota_type, topic)

    def _rate(self, topic: str, now_ms: float) -> Rate | None:
        make, key = self.stats.rate, self._sensor_key(topic)
        return self.sensors.get_or_create(key, now_ms, lambda: make(key))

    def _bounded_rate(self, topic: str, now_ms: float) -> tuple[Rate, float] | None:
        """The topic's rate and bound; None when it has no quota, or the entity cap left it
        unmeasured (then it is not held either)."""
        bound = self.bound(topic)
        if bound is None:
            return None
        rate = self._rate(topic, now_ms)
        return None if rate is None else (rate, bound)

    def record(self, topic: str, size: float, now_ms: float) -> TopicCharge:
        """Record `size` bytes of the topic and decide, as ClientQuotaManager does for a client:
        over the bound after recording is a throttle of Kafka's formula."""
        found = self._bounded_rate(topic, now_ms)
        if found is None:
            return UNLIMITED
        rate, bound = found
        rate.record(size, now_ms)
        if rate.surely_within(bound, now_ms):
            return TopicCharge(0, bound)
        measured = rate.measure(now_ms)
        if measured <= bound:
            return TopicCharge(0, bound)
        throttle = rate_throttle_time_ms(rate, measured, bound, now_ms, None)
        return TopicCharge(min(max(throttle, 0), INT_MAX), bound)

    def unrecord(self, topic: str, size: float, now_ms: float) -> None:
        """Take back recorded bytes that were not delivered (a throttled topic of a Fetch)."""
        if self.quota(topic) is None:
            return
        rate = self._rate(topic, now_ms)
        if rate is not None:
            rate.record(-size, now_ms)

    def measure(self, topic: str, now_ms: float) -> float:
        """The topic's current rate in this scope (0.0 if it has no sensor)."""
        stat = self.sensors.get(self._sensor_key(topic), now_ms)
        return 0.0 if stat is None else stat.measure(now_ms)  # type: ignore[attr-defined]

    def admit(self, topic: str, size: float, now_ms: float, refuse: bool = True) -> TopicCharge:
        """A Produce's bytes of the topic: taken while the topic's rate is within its bound,
        refused (not recorded) while it is over. The bytes that take the rate over pass, as on
        Kafka, and the next are refused until the rate is back within the bound: each request
        is judged on the rate itself, not on a mute of Kafka's predicted length, so a topic that
        comes back under its bound takes bytes at once. `throttle_ms` of a refusal is Kafka's
        throttle for the rate as it stands (the wait it predicts), at least 1 ms. With
        `refuse` False (observe mode; acks=0, which cannot be refused) over-bound bytes are
        recorded and only reported."""
        found = self._bounded_rate(topic, now_ms)
        if found is None:
            return UNLIMITED
        rate, bound = found
        throttle = 0
        if not rate.surely_within(bound, now_ms):
            measured = rate.measure(now_ms)
            if measured > bound:
                throttle = min(max(rate_throttle_time_ms(rate, measured, bound, now_ms, None), 1), INT_MAX)
                if refuse:
                    return TopicCharge(throttle, bound)
        rate.record(size, now_ms)
        return TopicCharge(throttle, bound)

    def topics(self, now_ms: float) -> list[tuple[str, Rate]]:
        """The topics measured here and their rates, for the metrics."""
        return [(key[1], stat) for key, stat in self.sensors.entries(now_ms)  # type: ignore[misc,index]
                if isinstance(key, tuple) and key[:1] == (self.quota_type,)]

