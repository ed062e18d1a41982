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
from kafka_quota_proxy.quota.kinds import QuotaKind, client_keys, tenant_kinds, topic_keys


@dataclass(frozen=True, slots=True)
class Measure:
    """One measure: `amount` is the usage record's counter, `throttle` its throttle_ms type."""

    name: str
    key: QuotaKey
    amount: str
    throttle: str
    unit: str
    title: str


def _measure(kind: QuotaKind) -> Measure:
    assert kind.measure is not None and kind.usage_counter is not None, f"{kind.key} is no tenant's"
    return Measure(kind.measure, kind.key, kind.usage_counter, kind.throttle_type, kind.unit, kind.title)


# The kinds the pipeline reports: those with a usage counter and a measure (the built-in tenant
# kinds; a kind registered with neither is in the usage log's throttles and quotas only).
MEASURES = tuple(_measure(kind) for kind in tenant_kinds() if kind.measure is not None)
BY_NAME = {m.name: m for m in MEASURES}
BY_KEY = {m.key: m for m in MEASURES}
PRODUCE, FETCH = BY_KEY[QuotaKey.PRODUCER_BYTE_RATE], BY_KEY[QuotaKey.CONSUMER_BYTE_RATE]
REQUEST, MUTATIONS = BY_KEY[QuotaKey.REQUEST_PERCENTAGE], BY_KEY[QuotaKey.CONTROLLER_MUTATION_RATE]
PRODUCER_IDS = BY_KEY[QuotaKey.PRODUCER_IDS_RATE]
# The measures whose quota is set per (user, client-id); producer_ids_rate is per user only.
CLIENT_MEASURES = tuple(m for m in MEASURES if m.key in client_keys())
# The measures a topic quota limits (usage_log.topics), with the same keys as a client's.
TOPIC_MEASURES = tuple(m for m in MEASURES if m.key in topic_keys())


def per_second(measure: Measure) -> float:
    """What one unit of the record's amount is worth per second of interval: request time is
    recorded in ms and its rate is a percentage (1 s of one thread per second = 100 %)."""
    return 0.1 if measure is REQUEST else 1.0
