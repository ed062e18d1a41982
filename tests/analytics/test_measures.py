"""analytics/measures.py: one measure per tenant quota kind, derived from the registry
(quota/kinds.py), with the names, counters, throttle types, units and titles the pipeline's
tables and reports use."""

from __future__ import annotations

from kafka_quota_proxy.analytics.measures import (
    BY_KEY,
    BY_NAME,
    BYTE_MEASURES,
    CLIENT_MEASURES,
    MEASURES,
    TOPIC_MEASURES,
    USER_MEASURES,
    Measure,
    per_second,
)
from kafka_quota_proxy.analytics.reading import usage_schema
from kafka_quota_proxy.analytics.replay import KINDS
from kafka_quota_proxy.analytics.whatif import KIND_MEASURES
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.kinds import registered
from tests.support.kinds import LIST_GROUPS_RATE

PRODUCE, FETCH, REQUEST, MUTATIONS, PRODUCER_IDS = (BY_KEY[key] for key in (
    QuotaKey.PRODUCER_BYTE_RATE, QuotaKey.CONSUMER_BYTE_RATE, QuotaKey.REQUEST_PERCENTAGE,
    QuotaKey.CONTROLLER_MUTATION_RATE, QuotaKey.PRODUCER_IDS_RATE))


def test_one_measure_per_tenant_kind_as_the_tables_name_them() -> None:
    assert MEASURES == (
        Measure("produce", QuotaKey.PRODUCER_BYTE_RATE, "produce_bytes", "produce", "B/s", "Produce bytes/s"),
        Measure("fetch", QuotaKey.CONSUMER_BYTE_RATE, "fetch_bytes", "fetch", "B/s", "Fetch bytes/s"),
        Measure("request", QuotaKey.REQUEST_PERCENTAGE, "request_time_ms", "request", "%",
                "Request time, % of a thread", 0.1),
        Measure("mutations", QuotaKey.CONTROLLER_MUTATION_RATE, "partitions_mutated", "controller_mutation",
                "partitions/s", "Partition mutations/s"),
        Measure("producer_ids", QuotaKey.PRODUCER_IDS_RATE, "new_producer_ids", "producer_ids", "ids/s",
                "New producer ids/s"),
    )
    assert MEASURES == (PRODUCE, FETCH, REQUEST, MUTATIONS, PRODUCER_IDS)
    assert CLIENT_MEASURES == (PRODUCE, FETCH, REQUEST, MUTATIONS)
    assert USER_MEASURES == (PRODUCER_IDS,)  # producer_ids_rate: per user alone
    assert TOPIC_MEASURES == BYTE_MEASURES == (PRODUCE, FETCH)
    assert all(BY_NAME[m.name] is m for m in MEASURES)
    assert all(c is m for c, m in zip(CLIENT_MEASURES, MEASURES, strict=False))


def test_request_time_in_ms_is_a_percentage_of_one_thread() -> None:
    assert per_second(REQUEST) == 0.1
    assert {per_second(m) for m in MEASURES if m is not REQUEST} == {1.0}


def test_the_what_if_replays_the_byte_rates_by_their_measures() -> None:
    assert KINDS == {"produce": QuotaKey.PRODUCER_BYTE_RATE, "fetch": QuotaKey.CONSUMER_BYTE_RATE}
    assert KIND_MEASURES == {"produce": PRODUCE, "fetch": FETCH}


def test_a_registered_kinds_throttles_quota_and_counter_are_in_the_pipelines_schema() -> None:
    def fields() -> tuple[list[str], list[str]]:
        schema = usage_schema()
        return schema["throttle_ms"].dataType.fieldNames(), schema["quotas"].dataType.fieldNames()

    built_in = (["produce", "fetch", "request", "controller_mutation", "producer_ids"],
                ["producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate",
                 "producer_ids_rate"])
    assert fields() == built_in
    with registered(LIST_GROUPS_RATE):
        assert fields() == (built_in[0] + ["list_groups"], built_in[1] + ["list_groups_request_rate"])
        # its counter, a column of the records beside the built-in kinds' ones
        assert usage_schema().fieldNames()[6:13] == [
            "produce_bytes", "fetch_bytes", "request_time_ms", "partitions_mutated", "new_producer_ids",
            "list_groups_requests", "connections"]
        assert MEASURES == (PRODUCE, FETCH, REQUEST, MUTATIONS, PRODUCER_IDS)  # no measure: no report
    assert fields() == built_in
    assert "list_groups_requests" not in usage_schema().fieldNames()
