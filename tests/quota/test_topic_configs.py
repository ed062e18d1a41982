"""Topic quotas as topic configs: which ops are the proxy's, how they are checked, how the answers
merge, what DescribeConfigs gains."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.quota.admin_api import QuotaRequestError
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.topic_configs import (
    APPEND,
    DELETE,
    SET,
    SUBTRACT,
    AlterPlan,
    TopicAlteration,
    describe_entries,
    merge_answers,
    resource_conflicts,
    split_resource,
)

P, C = "producer_byte_rate", "consumer_byte_rate"


def refusal(name: str, configs: list[tuple[str, int, str | None]]) -> tuple[int, str]:
    with pytest.raises(QuotaRequestError) as caught:
        split_resource(name, configs)
    return caught.value.error_code, caught.value.message


def test_the_quota_ops_become_alter_client_quotas_ops_and_the_rest_stays_the_brokers() -> None:
    # kafka-configs.sh: the DELETE ops first, then the SETs.
    configs = [(C, DELETE, ""), (P, SET, "1048576"), ("retention.ms", SET, "1000")]
    assert split_resource("orders", configs) == TopicAlteration(
        ops=[(C, 0.0, True), (P, 1048576.0, False)], broker_ops=1)
    assert split_resource("orders", [(P, DELETE, None)]) == TopicAlteration([(P, 0.0, True)], 0)
    # Blanks around a LONG are read as a broker reads them; the largest LONG is allowed.
    assert split_resource("t", [(P, SET, " 2048\t")]).ops == [(P, 2048.0, False)]
    assert split_resource("t", [(C, SET, str(2**63 - 1))]).ops == [(C, float(2**63 - 1), False)]


@pytest.mark.parametrize(("value", "message"), [
    ("abc", "Invalid value abc for configuration producer_byte_rate: Not a number of type LONG"),
    ("1.5", "Invalid value 1.5 for configuration producer_byte_rate: Not a number of type LONG"),
    ("1e6", "Invalid value 1e6 for configuration producer_byte_rate: Not a number of type LONG"),
    ("1_000", "Invalid value 1_000 for configuration producer_byte_rate: Not a number of type LONG"),
    ("", "Invalid value  for configuration producer_byte_rate: Not a number of type LONG"),
    (str(2**63), f"Invalid value {2**63} for configuration producer_byte_rate: Not a number of type LONG"),
    ("0", "Quota producer_byte_rate must be greater than 0"),
    ("-5", "Quota producer_byte_rate must be greater than 0"),
])
def test_a_bad_value_is_invalid_config_with_the_reason(value: str, message: str) -> None:
    assert refusal("orders", [("retention.ms", SET, "1"), (P, SET, value)]) == (40, message)


def test_append_and_subtract_are_invalid_config_as_on_any_key_that_is_not_a_list() -> None:
    assert refusal("t", [(P, APPEND, "1")]) == (
        40, "Can't APPEND to key producer_byte_rate because its type is not LIST.")
    assert refusal("t", [(C, SUBTRACT, "1")]) == (
        40, "Can't SUBTRACT to key consumer_byte_rate because its type is not LIST.")


def test_the_whole_resource_is_checked_for_its_shape_as_a_broker_checks_it() -> None:
    assert refusal("t", [(P, SET, "1"), (P, DELETE, None)]) == (42, "Error due to duplicate config keys")
    assert refusal("t", [("retention.ms", SET, "1"), ("retention.ms", SET, "2"), (P, SET, "1")]) == (
        42, "Error due to duplicate config keys")
    assert refusal("t", [("cleanup.policy", APPEND, None), (P, SET, None)]) == (
        42, "Null value not supported for : cleanup.policy, producer_byte_rate")
    assert refusal("t", [(P, SET, "1"), ("retention.ms", 9, "1")]) == (
        42, "Unknown alter config operation type 9")


def test_a_topic_name_the_entity_cannot_hold_is_refused() -> None:
    assert refusal("", [(P, SET, "1")]) == (42, "Default topic resources are not allowed.")
    code, message = refusal("<default>", [(P, SET, "1")])
    assert code == 42 and message.startswith("<default> is not a topic: set the default topic quota with")


def test_answers_merge_in_the_request_order() -> None:
    plan = AlterPlan(resources=[(2, "a"), (4, "1"), (2, "b"), (2, "c")],
                     answers=[(0, None), None, (40, "bad"), None])
    broker = [(2, "c", 0, None), (4, "1", 0, None)]  # a broker's own order
    assert merge_answers(plan, broker) == [(2, "a", 0, None), (4, "1", 0, None), (2, "b", 40, "bad"),
                                           (2, "c", 0, None)]
    # A resource the broker did not answer is left out; an answer for none is kept, at the end.
    assert merge_answers(plan, [(2, "c", 0, None), (2, "x", 3, "?")]) == [
        (2, "a", 0, None), (2, "b", 40, "bad"), (2, "c", 0, None), (2, "x", 3, "?")]


def test_resources_named_twice() -> None:
    assert resource_conflicts([(2, "a"), (2, "b"), (4, "a"), (2, "a")]) == {0, 3}
    assert resource_conflicts([(2, "a"), (4, "a")]) == set()


def test_describe_shows_the_keys_set_or_those_asked_for() -> None:
    values = {QuotaKey.PRODUCER_BYTE_RATE: 1048576.0, QuotaKey.CONSUMER_BYTE_RATE: 5e7}
    assert describe_entries(values, None) == [(C, "50000000"), (P, "1048576")]
    assert describe_entries(values, [P, "retention.ms"]) == [(P, "1048576")]
    assert describe_entries(values, []) == describe_entries(values, None)  # empty is all, as on Kafka
    assert describe_entries({}, None) == []
