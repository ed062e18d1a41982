"""The measures the pipeline reports on, one per tenant quota kind (quota/kinds.py), each tied to
the quota key that limits it.

A measure is a per-interval rate computed from one usage record (quota/usage.py): its amount in
the interval divided by the interval's length, in the unit its quota key uses. The same names
are used in the tables' columns (`produce_p99`, `demand_produce_p99`, ...), in the outliers
table, in the generator's manifest and in the recommendations, so one word means one thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.kinds import QuotaKind, client_keys, kind_of, tenant_kinds, topic_keys


@dataclass(frozen=True, slots=True)
class Measure:
    """One measure: `amount` is the usage record's counter, `throttle` its throttle_ms type."""

    name: str
    key: QuotaKey
    amount: str
    throttle: str
    unit: str
    title: str
    scale: float = 1.0  # one unit of `amount` per second, in `unit` (QuotaKind.usage_scale)


def _measure(kind: QuotaKind) -> Measure:
    assert kind.measure is not None and kind.usage_counter is not None, f"{kind.key} is no tenant's"
    return Measure(kind.measure, kind.key, kind.usage_counter, kind.throttle_type, kind.unit, kind.title,
                   kind.usage_scale)


# The kinds the pipeline reports: those with a usage counter and a measure (the built-in tenant
# kinds; a kind registered with neither is in the usage log's throttles and quotas only).
MEASURES = tuple(_measure(kind) for kind in tenant_kinds() if kind.measure is not None)
BY_NAME = {m.name: m for m in MEASURES}
BY_KEY = {m.key: m for m in MEASURES}
# The measures whose quota is set per (user, client-id), and those set per user alone
# (producer_ids_rate, KIP-936), which the pipeline measures per user over hours, as KIP-936's
# window is an hour.
CLIENT_MEASURES = tuple(m for m in MEASURES if m.key in client_keys())
USER_MEASURES = tuple(m for m in MEASURES if m.key not in client_keys())
# The measures a topic quota limits (usage_log.topics), with the same keys as a client's.
TOPIC_MEASURES = tuple(m for m in MEASURES if m.key in topic_keys())
# The byte rates (KIP-13), which the report's tables and plots lead with.
BYTE_MEASURES = tuple(m for m in MEASURES if kind_of(m.key).byte_rate)


def per_second(measure: Measure) -> float:
    """What one unit of the record's amount is worth per second of interval: request time is
    recorded in ms and its rate is a percentage (1 s of one thread per second = 100 %)."""
    return measure.scale
