"""One /metrics for N workers: each worker's exposition merged, metric by metric, into what one
process would have shown (docs/metrics.md, "With --workers").

Summing is right for what workers count or hold each on their own (requests, bytes, connections
open, throttle time). It is wrong for a value that states a configuration every worker holds
alike (a quota, the quota mode: N times the quota would be a lie), and for an estimate whose
worst case is what matters (a Bloom filter's false-positive rate). Every metric a proxy exports
has its rule in RULES; a test keeps the table complete.

A worker that dies takes its counters with it. So that a merged counter never goes backwards
(Prometheus would read that as a reset and count the whole value again), the last counts scraped
from a worker that is gone are kept and added to every later merge (`Retired`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from kafka_quota_proxy.proxy.observability.metrics import METRIC_PREFIX as P

SUM, MAX, MIN = "sum", "max", "min"
# A rule, or a function of a sample's labels and of whether the workers share a store.
Rule = str | Callable[[Mapping[str, str], bool], str]


def _by_source(labels: Mapping[str, str], shared: bool) -> str:
    # An API call reaches one worker; a file change, or one adopted from the store, every worker.
    return SUM if labels.get("source") == "api" else MAX


def _max_if_shared(labels: Mapping[str, str], shared: bool) -> str:
    # With a store each worker measures the entity over every replica (up to the sync lag).
    return MAX if shared else SUM


# Family name as Prometheus' parser gives it (a counter without `_total`) -> rule.
RULES: dict[str, Rule] = {
    # The proxy's own (observability/metrics.py): each worker counts its own connections.
    P + "connections_open": SUM,
    P + "connections_accepted": SUM,
    P + "connections_closed": SUM,
    P + "idle_connections_closed": SUM,
    P + "quota_changes": _by_source,
    P + "protocol_errors": SUM,
    P + "authentication_failures": SUM,
    P + "upstream_connect_failures": SUM,
    P + "spliced_bytes": SUM,
    P + "requests": SUM,
    P + "request_bytes": SUM,
    P + "response_bytes": SUM,
    P + "upstream_latency_seconds": SUM,  # a histogram: buckets, count and sum add up
    # The usage log's health (observability/usage_log.py): each worker writes its own records.
    P + "usage_records_written": SUM,
    P + "usage_records_dropped": SUM,
    P + "usage_requests_unmetered": SUM,
    P + "usage_topics_unmetered": SUM,
    P + "usage_write_errors": SUM,
    # Quota measurements (observability/quota_metrics.py). Without a store a rate is that worker's
    # share of the entity's traffic, and the sum is the entity's rate; with one, every worker
    # reads the rate over all replicas, and the sum would count it N times.
    P + "byte_rate": _max_if_shared,
    P + "byte_rate_local": SUM,  # each worker's own part (with a store only)
    P + "request_time_percent": SUM,  # local by design: percent of one thread per worker
    P + "request_rate": SUM,  # a request-rate kind's (QuotaKind.counts): each worker's own count
    P + "mutation_rate": MAX,  # the bucket's refill rate: the controller_mutation_rate quota
    P + "mutation_tokens": _max_if_shared,  # own buckets, or buckets charged with all spending
    P + "throttle_time_ms": SUM,
    P + "throttled_requests": SUM,
    P + "connection_accept_throttle_time_ms": SUM,
    P + "quota_entities_dropped": SUM,
    # Configuration every worker holds alike: the value itself, not N times it.
    P + "quota_limit": MAX,
    P + "configured_quota": MAX,
    P + "quota_mode": MAX,
    # The producer-id quota (KIP-936).
    P + "producer_id_rate": _max_if_shared,
    P + "producer_ids_tracked": SUM,  # ids in all workers' filters (one seen by two counts twice)
    P + "producer_id_false_positive_rate": MAX,  # the worst worker's estimate
    P + "producer_id_rejections": SUM,
    P + "producer_id_cache_users": MAX,  # against quota.producer_ids.max_users, a per-worker cap
    P + "producer_id_cache_bytes": SUM,  # memory held on the host
    P + "producer_id_cache_dropped_users": SUM,
    P + "producer_id_cache_overfull_adds": SUM,
    # Topic quotas (docs/topic-quotas.md): rates as byte_rate; quotas and shares are settings.
    P + "topic_byte_rate": _max_if_shared,
    P + "topic_quota": MAX,
    P + "topic_quota_share": MAX,
    P + "topic_throttle_time_ms": SUM,
    P + "topic_throttled_requests": SUM,
    # The shared store's sync (observability/store_metrics.py): each worker is a replica.
    P + "store_syncs": SUM,
    P + "store_errors": SUM,
    P + "store_sync_duration_seconds": SUM,
    P + "store_sync_lag_seconds": MAX,  # the worst worker's: how late the host sees the others
    P + "store_degraded": MAX,  # 1 while any worker is
    P + "store_replicas": MAX,  # every worker reads the same heartbeats
    P + "store_entities": SUM,
    P + "store_turns_waiting": SUM,  # each worker claims turns of its own
    P + "store_turns_heading": SUM,
}
COUNTING_TYPES = ("counter", "histogram", "summary")  # what a dead worker's last counts carry on


def rule_for(family: str, labels: Mapping[str, str], shared: bool = False) -> str:
    """How a family's samples combine across workers (`shared`: they sync through a store):
    `_created` the earliest, else RULES (SUM for a family the table does not know, which a test
    does not let through)."""
    if family.endswith("_created"):
        return MIN
    rule = RULES.get(family, SUM)
    return rule(labels, shared) if callable(rule) else rule


SampleKey = tuple[str, str, tuple[tuple[str, str], ...]]  # family, sample name, sorted labels


def _key(family: str, name: str, labels: Mapping[str, str]) -> SampleKey:
    return family, name, tuple(sorted(labels.items()))


@dataclass
class Retired:
    """The counts of workers that are gone, kept so that merged counters stay monotonic."""

    totals: dict[SampleKey, float] = field(default_factory=dict)
    families: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (help, type)

    def add(self, families: Iterable[Metric], shared: bool = False) -> None:
        for f in families:
            if f.type not in COUNTING_TYPES or f.name.endswith("_created"):
                continue
            self.families.setdefault(f.name, (f.documentation, f.type))
            for s in f.samples:
                if s.name.endswith("_created") or rule_for(f.name, s.labels, shared) != SUM:
                    continue
                k = _key(f.name, s.name, s.labels)
                self.totals[k] = self.totals.get(k, 0.0) + s.value


def merge(scrapes: Iterable[Iterable[Metric]], retired: Retired | None = None,
          shared: bool = False) -> list[Metric]:
    """The workers' families merged by RULES, in the order first seen, plus retired counts;
    `shared`: the workers sync their quota state through a store."""
    order: list[str] = []
    heads: dict[str, tuple[str, str]] = {}
    values: dict[str, dict[SampleKey, float]] = {}
    labels_of: dict[SampleKey, Mapping[str, str]] = {}
    for families in scrapes:
        for f in families:
            if f.name not in heads:
                heads[f.name] = (f.documentation, f.type)
                order.append(f.name)
                values[f.name] = {}
            merged = values[f.name]
            for s in f.samples:
                k = _key(f.name, s.name, s.labels)
                if k not in merged:
                    merged[k] = s.value
                    labels_of[k] = s.labels
                    continue
                rule = MIN if s.name.endswith("_created") else rule_for(f.name, s.labels, shared)
                merged[k] = (merged[k] + s.value if rule == SUM else
                             max(merged[k], s.value) if rule == MAX else min(merged[k], s.value))
    if retired is not None:
        for k, value in retired.totals.items():
            name = k[0]
            if name not in heads:
                heads[name] = retired.families[name]
                order.append(name)
                values[name] = {}
            values[name][k] = values[name].get(k, 0.0) + value
            labels_of.setdefault(k, dict(k[2]))
    out = []
    for name in order:
        documentation, typ = heads[name]
        metric = Metric(name, documentation, typ)
        for k, value in values[name].items():
            metric.add_sample(k[1], dict(labels_of[k]), value)
        out.append(metric)
    return out
