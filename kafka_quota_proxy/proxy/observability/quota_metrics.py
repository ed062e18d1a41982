"""Quota metrics that mirror a Kafka broker's (kafka.server:type=Produce|Fetch|Request|
ControllerMutation, user=, client-id=), read from the quota managers at scrape time.

Reading at scrape time costs nothing per request, and the series are exactly the managers' live
sensors: their number is bounded by quota.max_tracked_entities and they expire after an hour
idle, like Kafka's. Labels `user` and `client_id` are the sensor's tags (a user's tag is its
sanitized principal; an empty tag means the measurement is shared, as in Kafka's JMX names).

The state read belongs to the event loop: every request moves its sensor within an ordered dict,
adds throttle records, and a scrape expires idle sensors. The metrics endpoint serves scrapes on
its own thread, so a scrape is handed to the loop and read there; read from the HTTP thread, a
scrape that met a request mid-iteration failed with "OrderedDict mutated during iteration" (HTTP
500), found by the soak (docs/reliability.md, "Soak").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterator
from typing import Any, cast

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kafka_quota_proxy.proxy.observability.metrics import METRIC_PREFIX
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.kinds import kind_of
from kafka_quota_proxy.quota.managers import ClientQuotaManager, ClientRequestQuotaManager
from kafka_quota_proxy.quota.mutations import ControllerMutationQuotaManager
from kafka_quota_proxy.quota.rate import Rate
from kafka_quota_proxy.quota.resolution import sanitize_user
from kafka_quota_proxy.quota.shared_rate import SharedRate
from kafka_quota_proxy.quota.token_bucket import TokenBucket

P = METRIC_PREFIX
LABELS = ["scope", "user", "client_id"]
SCRAPE_TIMEOUT_SECONDS = 10.0  # a loop that cannot spare a moment for this long fails the scrape


class QuotaCollector(Collector):
    """Exports the quota engine's state at scrape time: quotas, rates, throttles, per entity.

    `loop` gives the event loop that owns the engine (None before it runs); a scrape from another
    thread is read on that loop."""

    def __init__(self, engine: QuotaEngine,
                 loop: Callable[[], asyncio.AbstractEventLoop | None] = lambda: None) -> None:
        self.engine = engine
        self.loop = loop

    def collect(self) -> Iterator[Any]:
        loop = self.loop()
        if loop is None or not loop.is_running() or _running_loop() is loop:
            return iter(list(self._collect()))
        read: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()

        def on_loop() -> None:
            try:
                read.set_result(list(self._collect()))
            except BaseException as exc:  # handed to the scraping thread, which reports it
                read.set_exception(exc)

        loop.call_soon_threadsafe(on_loop)
        return iter(read.result(SCRAPE_TIMEOUT_SECONDS))

    def _topics(self, now: int) -> Iterator[Any]:
        """Topic quotas (docs/topic-quotas.md): per topic and scope, the rate, the quota and the
        part of it this scope allows (Q times the share of partitions its broker leads)."""
        engine = self.engine
        labels = ["quota_type", "scope", "topic"]
        rate = GaugeMetricFamily(P + "topic_byte_rate", "Measured bytes/s per topic", labels=labels)
        quota = GaugeMetricFamily(P + "topic_quota", "The topic's configured quota (bytes/s)",
                                  labels=labels)
        share = GaugeMetricFamily(P + "topic_quota_share", "The part of the topic's quota this "
                                  "scope allows (bytes/s): per broker, Q x partitions led / partitions",
                                  labels=labels)
        for scope, managers in engine.scopes():
            for manager in managers.topics.values():
                for topic, stat in manager.topics(now):
                    names = [manager.key.value, scope, topic]
                    rate.add_metric(names, stat.measure(now))
                    configured, bound = manager.quota(topic), manager.bound(topic)
                    if configured is not None and bound is not None:
                        quota.add_metric(names, configured)
                        share.add_metric(names, bound)
        throttle = CounterMetricFamily(P + "topic_throttle_time_ms", "Topic quota throttles: time "
                                       "a topic's partitions were refused or answered empty (or, in "
                                       "observe mode, would have been)", labels=["quota_type", "topic"])
        throttled = CounterMetricFamily(P + "topic_throttled_requests", "Requests in which a topic "
                                        "was refused or answered empty (or would have been)",
                                        labels=["quota_type", "topic"])
        for (quota_type, topic, _), rec in engine.topic_throttles.records.items():
            throttle.add_metric([quota_type, topic], rec.total_ms)
            throttled.add_metric([quota_type, topic], rec.count)
        yield from (rate, quota, share, throttle, throttled)

    def _collect(self) -> Iterator[Any]:
        engine = self.engine
        now = engine.clock()
        byte_rate = GaugeMetricFamily(P + "byte_rate", "Measured bytes/s per quota entity, as Kafka's "
                                      "byte-rate", labels=["quota_type", *LABELS])
        request_time = GaugeMetricFamily(P + "request_time_percent", "Measured request time per quota "
                                         "entity, in percent of one thread (Kafka's request-time)",
                                         labels=LABELS)
        mutation_rate = GaugeMetricFamily(P + "mutation_rate", "Measured partition mutations/s",
                                          labels=LABELS)
        tokens = GaugeMetricFamily(P + "mutation_tokens", "Controller mutation tokens left",
                                   labels=LABELS)
        limit = GaugeMetricFamily(P + "quota_limit", "The quota in force for a measured entity",
                                  labels=["quota_type", *LABELS])
        local_rate = GaugeMetricFamily(P + "byte_rate_local", "With a shared store: this replica's "
                                       "own part of byte_rate (byte_rate is every replica's)",
                                       labels=["quota_type", *LABELS])
        request_rate = GaugeMetricFamily(P + "request_rate", "Measured requests/s per quota entity, "
                                         "for each request-rate kind (QuotaKind.counts)",
                                         labels=["quota_type", *LABELS])
        for scope, managers in engine.scopes():
            for manager in managers.clients.values():
                if isinstance(manager, ControllerMutationQuotaManager):
                    self._mutations(scope, manager, now, tokens, mutation_rate)
                elif isinstance(manager, ClientQuotaManager):
                    # a byte rate, request time, or a request-rate kind's (QuotaKind.counts)
                    timed = isinstance(manager, ClientRequestQuotaManager)
                    family = (request_time if timed
                              else byte_rate if kind_of(manager.key).byte_rate else request_rate)
                    self._rates(scope, manager, now, family, not timed, local_rate, limit)
        yield from self._producer_ids(now, limit)
        yield from (byte_rate, local_rate, request_time, mutation_rate, tokens, limit, request_rate)
        yield from self._topics(now)

        throttle_ms = CounterMetricFamily(P + "throttle_time_ms", "Throttle time applied (or, in "
                                          "observe mode, that would have been)", labels=[
                                              "quota_type", "user", "client_id"])
        throttled = CounterMetricFamily(P + "throttled_requests", "Requests throttled (or, in observe "
                                        "mode, that would have been)", labels=[
                                            "quota_type", "user", "client_id"])
        for (quota_type, user, client), rec in engine.throttles.records.items():
            throttle_ms.add_metric([quota_type, user, client], rec.total_ms)
            throttled.add_metric([quota_type, user, client], rec.count)
        yield throttle_ms
        yield throttled
        accept = CounterMetricFamily(P + "connection_accept_throttle_time_ms", "Connections over "
                                     "connection_creation_rate: total delay before closing them",
                                     labels=["ip"])
        for (_, ip, _), rec in engine.connection_throttles.records.items():
            accept.add_metric([ip], rec.total_ms)
        yield accept
        configured = GaugeMetricFamily(P + "configured_quota", "Every configured quota, by entity",
                                       labels=["quota_type", "user", "client_id", "ip", "topic"])
        for entity, values in engine.store.entries().items():
            for key, value in values.items():
                configured.add_metric([key.value, *(name or "" for name in entity.names())], value)
        yield configured
        dropped = CounterMetricFamily(P + "quota_entities_dropped", "Entities not measured because "
                                      "quota.max_tracked_entities was reached")
        dropped.add_metric([], engine.dropped_entities())
        yield dropped
        mode = GaugeMetricFamily(P + "quota_mode", "1 for the quota mode in force", labels=["mode"])
        for name in ("enforce", "observe", "off"):
            mode.add_metric([name], 1.0 if engine.settings.mode == name else 0.0)
        yield mode

    @staticmethod
    def _rates(scope: str, manager: ClientQuotaManager, now: int, family: GaugeMetricFamily,
               typed: bool, local_rate: GaugeMetricFamily, limit: GaugeMetricFamily) -> None:
        """One rate manager's entities: their rates (in `family`, with a quota_type label when
        `typed`: request time has none), this replica's own part of a shared one, and the quota
        in force."""
        for key, stat in manager.sensors.entries(now):
            _, user, client = cast(tuple[str, str, str], key)
            labels = [scope, user, client]
            if not isinstance(stat, Rate):
                continue
            if not typed:
                family.add_metric(labels, stat.measure(now))
            else:
                family.add_metric([manager.key.value, *labels], stat.measure(now))
                if isinstance(stat, SharedRate):
                    local_rate.add_metric([manager.key.value, *labels], Rate.measure(stat, now))
            bound = manager.resolver.quota((user, client))
            if bound is not None:
                limit.add_metric([manager.key.value, *labels], bound)

    @staticmethod
    def _mutations(scope: str, manager: ControllerMutationQuotaManager, now: int, tokens: GaugeMetricFamily,
                   mutation_rate: GaugeMetricFamily) -> None:
        for key, stat in manager.sensors.entries(now):
            if isinstance(stat, TokenBucket):
                _, user, client = cast(tuple[str, str, str], key)
                tokens.add_metric([scope, user, client], stat.tokens(now))
                mutation_rate.add_metric([scope, user, client], stat.rate_per_s)

    def _producer_ids(self, now: int, limit: GaugeMetricFamily) -> Iterator[Any]:
        """KIP-936: per user, the new-id rate, ids remembered, the estimated false-positive rate
        and refusals; per scope, the cache's size and what its caps turned away."""
        rate = GaugeMetricFamily(P + "producer_id_rate", "New producer ids per second per user "
                                 "(producer_ids_rate's measure)", labels=["scope", "user"])
        tracked = GaugeMetricFamily(P + "producer_ids_tracked", "Producer ids remembered as seen "
                                    "per user (added to its live Bloom filters)", labels=["scope", "user"])
        fp_rate = GaugeMetricFamily(P + "producer_id_false_positive_rate", "Estimated chance that a "
                                    "new id of this user is taken for seen", labels=["scope", "user"])
        rejections = CounterMetricFamily(P + "producer_id_rejections", "Produce requests refused for "
                                         "the producer-id quota (action reject)", labels=["scope", "user"])
        users = GaugeMetricFamily(P + "producer_id_cache_users", "Users in the seen-producer-id cache",
                                  labels=["scope"])
        size = GaugeMetricFamily(P + "producer_id_cache_bytes", "Bloom filter bits held, in bytes",
                                 labels=["scope"])
        dropped = CounterMetricFamily(P + "producer_id_cache_dropped_users", "New users not tracked "
                                      "because quota.producer_ids.max_users was reached", labels=["scope"])
        overfull = CounterMetricFamily(P + "producer_id_cache_overfull_adds", "Ids added to a filter "
                                       "already holding its capacity (its false-positive rate then "
                                       "rises above the configured one)", labels=["scope"])
        for scope, m in self.engine.producer_id_managers():
            cache = m.cache
            users.add_metric([scope], len(cache))
            size.add_metric([scope], cache.memory_bytes())
            dropped.add_metric([scope], cache.dropped_users)
            overfull.add_metric([scope], cache.overfull_adds)
            for user in cache.users():
                tracked.add_metric([scope, sanitize_user(user)], cache.ids_tracked(user, now))
                fp_rate.add_metric([scope, sanitize_user(user)], cache.estimated_fp_rate(user, now))
            for key, stat in m.rate.sensors.entries(now):
                if isinstance(stat, Rate):
                    _, user_tag, _ = cast(tuple[str, str, str], key)
                    rate.add_metric([scope, user_tag], stat.measure(now))
                    bound = m.rate.resolver.quota((user_tag, ""))
                    if bound is not None:
                        limit.add_metric([QuotaKey.PRODUCER_IDS_RATE.value, scope, user_tag, ""], bound)
            for user_tag, count in m.rejections.items():
                rejections.add_metric([scope, user_tag], count)
        yield from (rate, tracked, fp_rate, rejections, users, size, dropped, overfull)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
