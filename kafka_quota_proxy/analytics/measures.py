"""The five measures the pipeline reports on, each tied to the quota key that limits it.

A measure is a per-interval rate computed from one usage record (quota/usage.py): its amount in
the interval divided by the interval's length, in the unit its quota key uses. The same names
are used in the tables' columns (`produce_p99`, `demand_produce_p99`, ...), in the outliers
table, in the generator's manifest and in the recommendations, so one word means one thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_quota_proxy.quota.entities import QuotaKey


@dataclass(frozen=True, slots=True)
class Measure:
    """One measure: `amount` is the usage record's counter, `throttle` its throttle_ms type."""

    name: str
    key: QuotaKey
    amount: str
    throttle: str
    unit: str
    title: str


PRODUCE = Measure("produce", QuotaKey.PRODUCER_BYTE_RATE, "produce_bytes", "produce", "B/s",
                  "Produce bytes/s")
FETCH = Measure("fetch", QuotaKey.CONSUMER_BYTE_RATE, "fetch_bytes", "fetch", "B/s", "Fetch bytes/s")
# request_time_ms over the interval as Kafka's request_percentage counts it: percent of one thread.
REQUEST = Measure("request", QuotaKey.REQUEST_PERCENTAGE, "request_time_ms", "request", "%",
                  "Request time, % of a thread")
MUTATIONS = Measure("mutations", QuotaKey.CONTROLLER_MUTATION_RATE, "partitions_mutated",
                    "controller_mutation", "partitions/s", "Partition mutations/s")
PRODUCER_IDS = Measure("producer_ids", QuotaKey.PRODUCER_IDS_RATE, "new_producer_ids", "producer_ids",
                       "ids/s", "New producer ids/s")

MEASURES = (PRODUCE, FETCH, REQUEST, MUTATIONS, PRODUCER_IDS)
BY_NAME = {m.name: m for m in MEASURES}
# The measures whose quota is set per (user, client-id); producer_ids_rate is per user only.
CLIENT_MEASURES = (PRODUCE, FETCH, REQUEST, MUTATIONS)
# The measures a topic quota limits (usage_log.topics), with the same keys as a client's.
TOPIC_MEASURES = (PRODUCE, FETCH)


def per_second(measure: Measure) -> float:
    """What one unit of the record's amount is worth per second of interval: request time is
    recorded in ms and its rate is a percentage (1 s of one thread per second = 100 %)."""
    return 0.1 if measure is REQUEST else 1.0
