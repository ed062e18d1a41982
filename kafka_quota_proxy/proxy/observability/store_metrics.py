"""Metrics of the shared quota store's sync (docs/metrics.md, "Shared store")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from kafka_quota_proxy.proxy.observability.metrics import METRIC_PREFIX
from kafka_quota_proxy.proxy.store.sync import StoreSync

P = METRIC_PREFIX
SYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class StoreCollector(Collector):
    """Reads the sync's plain numbers at scrape time (the sync only adds to them)."""

    def __init__(self, sync: StoreSync, clock: Callable[[], float]) -> None:
        self.sync = sync
        self.clock = clock
        self._counts = [0] * (len(SYNC_BUCKETS) + 1)
        self._sum = 0.0

    def collect(self) -> Iterator[Any]:
        stats = self.sync.stats
        # Fold the durations seen since the last scrape into a histogram kept here.
        durations, stats.durations_ms = stats.durations_ms, []
        for ms in durations:
            seconds = ms / 1000
            self._sum += seconds
            i = 0
            while i < len(SYNC_BUCKETS) and seconds > SYNC_BUCKETS[i]:
                i += 1
            self._counts[i] += 1
        buckets, total = [], 0
        for bound, count in zip((*map(str, SYNC_BUCKETS), "+Inf"), self._counts, strict=True):
            total += count
            buckets.append((bound, total))
        hist = HistogramMetricFamily(P + "store_sync_duration_seconds",
                                     "Time one sync with the quota store took", buckets=buckets,
                                     sum_value=self._sum)
        yield hist
        syncs = CounterMetricFamily(P + "store_syncs", "Syncs with the quota store that succeeded")
        syncs.add_metric([], stats.syncs)
        yield syncs
        errors = CounterMetricFamily(P + "store_errors", "Syncs with the quota store that failed "
                                     "(an error, or no answer within store.timeout_ms)")
        errors.add_metric([], stats.errors)
        yield errors
        lag = stats.lag_ms(self.clock())
        lag_g = GaugeMetricFamily(P + "store_sync_lag_seconds", "Time since the last successful "
                                  "sync: how late this replica may see the others' bytes")
        lag_g.add_metric([], float("inf") if lag is None else lag / 1000)
        yield lag_g
        degraded = GaugeMetricFamily(P + "store_degraded", "1 while the store cannot be reached and "
                                     "each quota is enforced as this replica's share")
        degraded.add_metric([], 1.0 if stats.degraded else 0.0)
        yield degraded
        replicas = GaugeMetricFamily(P + "store_replicas", "Replicas with a recent heartbeat in "
                                     "the store, this one included")
        replicas.add_metric([], self.sync.shared.live_replicas)
        yield replicas
        entities = GaugeMetricFamily(P + "store_entities", "Shared measurements this replica syncs")
        entities.add_metric([], stats.entities)
        yield entities
        turns = self.sync.turns
        waiting = GaugeMetricFamily(P + "store_turns_waiting", "Paced quotas on which this "
                                    "replica's clients wait for a turn in the store's queue")
        waiting.add_metric([], len(turns))
        yield waiting
        heading = GaugeMetricFamily(P + "store_turns_heading", "Paced quotas whose queue of turns "
                                    "this replica heads, as last read: its clients go when the "
                                    "quota's pace comes")
        heading.add_metric([], len(turns.heads))
        yield heading
