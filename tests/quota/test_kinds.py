"""quota/kinds.py: every quota key is one kind, declared once, and the lists of keys by entity,
the whole-number and extension keys and the usage log's throttle types are derived from it."""

from __future__ import annotations

from kafka_quota_proxy.quota import usage
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import (
    CLIENT_KEYS,
    EXTENSION_KEYS,
    IP_KEYS,
    KEY_NAMES,
    KIND,
    KINDS,
    TOPIC_KEYS,
    USER_ONLY_KEYS,
    WHOLE_NUMBER_KEYS,
    key_named,
    keys_for,
    throttle_type,
)

K = QuotaKey


def test_every_key_is_one_kind() -> None:
    assert [kind.key for kind in KINDS] == list(QuotaKey)
    assert set(KIND) == set(QuotaKey)
    assert KEY_NAMES == ("producer_byte_rate", "consumer_byte_rate", "request_percentage",
                         "controller_mutation_rate", "connection_creation_rate", "producer_ids_rate")
    assert [key_named(name) for name in KEY_NAMES] == list(QuotaKey)
    assert key_named("producer_byte_rates") is None and key_named(7) is None


def test_the_keys_each_entity_may_carry_are_kafkas_and_the_extensions() -> None:
    assert CLIENT_KEYS == {K.PRODUCER_BYTE_RATE, K.CONSUMER_BYTE_RATE, K.REQUEST_PERCENTAGE,
                           K.CONTROLLER_MUTATION_RATE}
    assert USER_ONLY_KEYS == EXTENSION_KEYS == {K.PRODUCER_IDS_RATE}
    assert IP_KEYS == {K.CONNECTION_CREATION_RATE}
    assert TOPIC_KEYS == {K.PRODUCER_BYTE_RATE, K.CONSUMER_BYTE_RATE}
    # Kafka's LONG and INT keys (QuotaConfigs): whole numbers only
    assert WHOLE_NUMBER_KEYS == {K.PRODUCER_BYTE_RATE, K.CONSUMER_BYTE_RATE, K.CONNECTION_CREATION_RATE}
    assert keys_for(QuotaEntity(user="alice")) == CLIENT_KEYS | {K.PRODUCER_IDS_RATE}
    assert keys_for(QuotaEntity(user=DEFAULT, client_id="c")) == CLIENT_KEYS
    assert keys_for(QuotaEntity(client_id="c")) == CLIENT_KEYS
    assert keys_for(QuotaEntity(ip=DEFAULT)) == IP_KEYS
    assert keys_for(QuotaEntity(topic="orders")) == TOPIC_KEYS
    assert {kind.key: kind.value_type for kind in KINDS if kind.whole_number} == {
        K.PRODUCER_BYTE_RATE: "LONG", K.CONSUMER_BYTE_RATE: "LONG", K.CONNECTION_CREATION_RATE: "INT"}


def test_throttles_are_counted_under_each_kinds_quota_type_and_the_usage_log_keeps_the_tenants() -> None:
    assert [throttle_type(kind.key) for kind in KINDS] == [
        "produce", "fetch", "request", "controller_mutation", "connection_creation_rate", "producer_ids"]
    # The usage log's record layout (quota/usage.py): a tenant's kinds, in the registry's order.
    assert usage.THROTTLE_TYPES == ("produce", "fetch", "request", "controller_mutation", "producer_ids")
    assert usage.QUOTA_KEYS == (K.PRODUCER_BYTE_RATE, K.CONSUMER_BYTE_RATE, K.REQUEST_PERCENTAGE,
                                K.CONTROLLER_MUTATION_RATE, K.PRODUCER_IDS_RATE)
