"""quota/kinds.py: every quota key is one kind, declared once, and the lists of keys by entity,
the whole-number and extension keys and the usage log's throttle types are derived from it; a
kind registered later is configured, validated and described as a built-in one is."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.quota_settings import parse_quota_list, validate_quota_entries
from kafka_quota_proxy.protocol.api_keys import (
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    FETCH,
    PRODUCE,
    SHARE_FETCH,
)
from kafka_quota_proxy.quota import usage
from kafka_quota_proxy.quota.admin_api import (
    INVALID_REQUEST,
    NONE,
    alter_client_quotas,
    describe_client_quotas,
)
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import (
    BUILT_IN,
    BUILT_IN_KEYS,
    NEW_PRODUCER_IDS,
    PERMITS,
    REQUEST_BYTES,
    REQUESTS,
    RESPONSE_BYTES,
    TIME_MS,
    QuotaKind,
    Registry,
    byte_rate_kinds,
    client_keys,
    counting,
    extension_keys,
    ip_keys,
    key_named,
    key_names,
    keys_for,
    kind_of,
    kinds,
    register,
    registered,
    throttle_type,
    topic_keys,
    unregister,
    user_only_keys,
    whole_number_keys,
)

K = QuotaKey

# A toy kind: a cap on a client's Metadata requests per second, on user and client-id entities,
# an extension Kafka does not know (issue 38's example).
METADATA_RATE = QuotaKind(QuotaKey("metadata_request_rate"), "metadata", value_type="INT",
                          extension=True)


def test_every_key_is_one_kind() -> None:
    assert kinds() == BUILT_IN
    assert [kind.key for kind in kinds()] == list(BUILT_IN_KEYS)
    assert key_names() == ("producer_byte_rate", "consumer_byte_rate", "request_percentage",
                           "controller_mutation_rate", "connection_creation_rate", "producer_ids_rate")
    assert [key_named(name) for name in key_names()] == list(BUILT_IN_KEYS)
    # the key named is the kind's own, whatever string it was looked up by
    assert all(key_named(str(k)) is kind.key for k, kind in zip(key_names(), kinds(), strict=True))
    assert key_named("producer_byte_rates") is None and key_named(7) is None
    assert kind_of(K.PRODUCER_IDS_RATE).throttle_type == "producer_ids"


def test_a_key_is_a_string_as_kafka_configs_spells_it() -> None:
    key = K.PRODUCER_BYTE_RATE
    assert key == "producer_byte_rate" and key.value == "producer_byte_rate" and f"{key}" == key.value
    assert QuotaKey("producer_byte_rate") == key and hash(QuotaKey("producer_byte_rate")) == hash(key)
    assert repr(key) == "QuotaKey('producer_byte_rate')"


def test_the_keys_each_entity_may_carry_are_kafkas_and_the_extensions() -> None:
    assert client_keys() == {K.PRODUCER_BYTE_RATE, K.CONSUMER_BYTE_RATE, K.REQUEST_PERCENTAGE,
                             K.CONTROLLER_MUTATION_RATE}
    assert user_only_keys() == extension_keys() == {K.PRODUCER_IDS_RATE}
    assert ip_keys() == {K.CONNECTION_CREATION_RATE}
    assert topic_keys() == {K.PRODUCER_BYTE_RATE, K.CONSUMER_BYTE_RATE}
    # Kafka's LONG and INT keys (QuotaConfigs): whole numbers only
    assert whole_number_keys() == {K.PRODUCER_BYTE_RATE, K.CONSUMER_BYTE_RATE, K.CONNECTION_CREATION_RATE}
    assert keys_for(QuotaEntity(user="alice")) == client_keys() | {K.PRODUCER_IDS_RATE}
    assert keys_for(QuotaEntity(user=DEFAULT, client_id="c")) == client_keys()
    assert keys_for(QuotaEntity(client_id="c")) == client_keys()
    assert keys_for(QuotaEntity(ip=DEFAULT)) == ip_keys()
    assert keys_for(QuotaEntity(topic="orders")) == topic_keys()
    assert {kind.key: kind.value_type for kind in kinds() if kind.whole_number} == {
        K.PRODUCER_BYTE_RATE: "LONG", K.CONSUMER_BYTE_RATE: "LONG", K.CONNECTION_CREATION_RATE: "INT"}


def test_throttles_are_counted_under_each_kinds_quota_type_and_the_usage_log_keeps_the_tenants() -> None:
    assert [throttle_type(kind.key) for kind in kinds()] == [
        "produce", "fetch", "request", "controller_mutation", "connection_creation_rate", "producer_ids"]
    # The usage log's record layout (quota/usage.py): a tenant's kinds, in the registry's order.
    assert usage.throttle_types() == ("produce", "fetch", "request", "controller_mutation", "producer_ids")
    assert usage.quota_keys() == (K.PRODUCER_BYTE_RATE, K.CONSUMER_BYTE_RATE, K.REQUEST_PERCENTAGE,
                                  K.CONTROLLER_MUTATION_RATE, K.PRODUCER_IDS_RATE)


def test_a_registered_kind_is_known_with_its_entities_and_value_type_then_gone() -> None:
    key = METADATA_RATE.key
    with registered(METADATA_RATE):
        assert kinds() == (*BUILT_IN, METADATA_RATE)
        assert key_named("metadata_request_rate") is key and key_names()[-1] == "metadata_request_rate"
        assert throttle_type(key) == "metadata"
        assert key in client_keys() and key in whole_number_keys() and key in extension_keys()
        assert key in keys_for(QuotaEntity(client_id="app")) and key not in keys_for(QuotaEntity(ip=DEFAULT))
        assert key not in topic_keys() and key not in ip_keys()
    assert kinds() == BUILT_IN and key_named("metadata_request_rate") is None
    assert key not in client_keys() and key not in whole_number_keys()


def test_a_registered_kind_is_configured_from_the_quota_file() -> None:
    entries = [{"client-id": "app", "metadata_request_rate": 50, "producer_byte_rate": 1048576}]
    with registered(METADATA_RATE):
        (entry,) = parse_quota_list(entries)
        assert entry.entity == QuotaEntity(client_id="app")
        assert entry.values == {METADATA_RATE.key: 50.0, K.PRODUCER_BYTE_RATE: 1048576.0}
        assert validate_quota_entries([entry]) == {QuotaEntity(client_id="app"): entry.values}
        fractional = parse_quota_list([{"client-id": "app", "metadata_request_rate": 0.5}])
        with pytest.raises(ConfigError, match="metadata_request_rate cannot be a fractional value"):
            validate_quota_entries(fractional)  # Kafka's rules for its INT value type
    with pytest.raises(ConfigError, match="unknown key"):
        parse_quota_list(entries)  # gone again


def test_a_registered_kind_is_set_validated_and_described_through_the_admin_api() -> None:
    app = [("client-id", "app")]
    with registered(METADATA_RATE):
        result = alter_client_quotas({}, [(app, [("metadata_request_rate", 50.0, False)])], False)
        assert result.results == [(NONE, None)]
        assert result.quotas == {QuotaEntity(client_id="app"): {METADATA_RATE.key: 50.0}}
        described = describe_client_quotas(result.quotas, [("client-id", 0, "app")], strict=True)
        assert described.entries == [(app, {"metadata_request_rate": 50.0})]
        # its value type is Kafka's INT: whole numbers, at most 2**31 - 1
        for bad, message in ((2.5, "metadata_request_rate cannot be a fractional value."),
                             (2.0**31, "Proposed value for metadata_request_rate is too large for an INT."),
                             (0.0, "Quota metadata_request_rate must be greater than 0")):
            refused = alter_client_quotas({}, [(app, [("metadata_request_rate", bad, False)])], False)
            assert refused.results == [(INVALID_REQUEST, message)]
        # not on an ip entity
        refused = alter_client_quotas({}, [([("ip", "10.0.0.1")], [("metadata_request_rate", 5.0, False)])],
                                      False)
        assert refused.results == [(INVALID_REQUEST, "Invalid configuration key metadata_request_rate")]
    # unregistered, the key is unknown again
    refused = alter_client_quotas({}, [(app, [("metadata_request_rate", 50.0, False)])], False)
    assert refused.results == [(INVALID_REQUEST, "Invalid configuration key metadata_request_rate")]


def test_a_key_is_declared_once_and_the_built_in_kinds_stay() -> None:
    with pytest.raises(ValueError, match="producer_byte_rate is already declared"):
        register(QuotaKind(K.PRODUCER_BYTE_RATE, "produce-again"))
    with pytest.raises(ValueError, match="producer_byte_rate is built in"):
        unregister(K.PRODUCER_BYTE_RATE)
    with registered(METADATA_RATE), pytest.raises(ValueError, match="already declared"):
        register(METADATA_RATE)
    assert kinds() == BUILT_IN


def test_the_byte_rates_are_the_built_in_produce_and_fetch_and_none_is_registered() -> None:
    assert [kind.key for kind in byte_rate_kinds()] == [K.PRODUCER_BYTE_RATE, K.CONSUMER_BYTE_RATE]
    with pytest.raises(ValueError, match="a byte rate is built in"):
        register(QuotaKind(QuotaKey("metadata_byte_rate"), "metadata_bytes", byte_rate=True))
    assert kinds() == BUILT_IN


def test_a_registered_kind_counts_on_kafkas_rate_measured_by_each_replica_alone() -> None:
    for kind in (QuotaKind(QuotaKey("metadata_tokens"), "metadata", manager="token_bucket"),
                 QuotaKind(QuotaKey("metadata_shared"), "metadata", shared="metadata")):
        with pytest.raises(ValueError, match="a registered kind counts requests on Kafka's Rate"):
            register(kind)
    assert kinds() == BUILT_IN
    assert [(kind.manager, kind.shared) for kind in BUILT_IN] == [
        ("rate", "produce"), ("rate", "fetch"), ("request_time", ""), ("token_bucket", "mutation"),
        ("connections", ""), ("producer_ids", "pids")]


def test_each_tenant_kind_declares_what_the_usage_meter_adds_for_it() -> None:
    assert {kind.key: kind.metered for kind in BUILT_IN} == {
        K.PRODUCER_BYTE_RATE: (REQUEST_BYTES, frozenset({PRODUCE})),
        K.CONSUMER_BYTE_RATE: (RESPONSE_BYTES, frozenset({FETCH, SHARE_FETCH})),
        K.REQUEST_PERCENTAGE: (TIME_MS, frozenset()),  # every request's
        K.CONTROLLER_MUTATION_RATE: (PERMITS, frozenset({CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS})),
        K.CONNECTION_CREATION_RATE: ("", frozenset()),  # a client address's, not a tenant's
        K.PRODUCER_IDS_RATE: (NEW_PRODUCER_IDS, frozenset({PRODUCE}))}
    # a request-rate kind's is one per request it counts, unless it says otherwise
    lists = QuotaKind(QuotaKey("lists_rate"), "lists", counts=frozenset({16}), usage_counter="lists")
    assert lists.metered == (REQUESTS, frozenset({16}))
    with pytest.raises(ValueError, match="its usage counter needs a usage fact the meter reads"):
        register(QuotaKind(QuotaKey("metadata_things"), "things", usage_counter="things"))
    with pytest.raises(ValueError, match="its usage counter needs a usage fact the meter reads"):
        register(QuotaKind(QuotaKey("metadata_things"), "things", usage_counter="things", usage_fact="bytes"))
    assert kinds() == BUILT_IN


def test_topic_quotas_are_named_and_documented_by_their_kind() -> None:
    with pytest.raises(ValueError, match="a topic quota is a byte rate, built in"):
        register(QuotaKind(QuotaKey("metadata_rate"), "metadata", topic=True))
    assert kinds() == BUILT_IN
    assert usage.TOPIC_COUNTERS == (
        "produce_bytes", "fetch_bytes", "produce_refused_bytes", "fetch_refused_bytes")
    assert usage.time_counters() == {"request_time_ms"}
    assert {kind.key: kind.topic_sensor for kind in BUILT_IN if kind.topic} == {
        K.PRODUCER_BYTE_RATE: "TopicProduce", K.CONSUMER_BYTE_RATE: "TopicFetch"}
    assert {key: kind_of(key).topic_doc.split(":")[1].split(" by ")[0] for key in topic_keys()} == {
        K.PRODUCER_BYTE_RATE: " bytes per second written to it",
        K.CONSUMER_BYTE_RATE: " bytes per second read from it"}


def test_a_registered_kind_is_charged_by_request_counts_alone() -> None:
    for stages in (("quota_charge",), ("request_counts", "quota_settle"), ("no_such_stage",)):
        with pytest.raises(ValueError, match="a registered kind is charged by the request_counts stage"):
            register(QuotaKind(QuotaKey("metadata_rate"), "metadata", stages=stages))
    assert kinds() == BUILT_IN
    with pytest.raises(ValueError, match="no such quota stage: no_such_stage"):
        Registry((*BUILT_IN, QuotaKind(QuotaKey("metadata_rate"), "metadata", stages=("no_such_stage",))))
    with registered(QuotaKind(QuotaKey("metadata_rate"), "metadata", stages=("request_counts",),
                              counts=frozenset({3}))) as kind:
        assert kind.charged_by == ("request_counts",)


def test_counting_maps_each_counted_api_to_the_kinds_that_count_it() -> None:
    lists = QuotaKind(QuotaKey("lists_rate"), "lists", counts=frozenset({16}))
    groups = QuotaKind(QuotaKey("groups_rate"), "groups", counts=frozenset({15, 16}))
    assert counting([lists, groups]) == {16: (0, 1), 15: (1,)}
    assert counting([]) == {}
