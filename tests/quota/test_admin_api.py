"""DescribeClientQuotas / AlterClientQuotas rules, ported from Kafka's ClientQuotasRequestTest."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from kafka_quota_proxy.protocol.error_codes import INVALID_REQUEST, UNSUPPORTED_VERSION
from kafka_quota_proxy.quota.admin_api import (
    NONE,
    AlterResult,
    QuotaChange,
    QuotaRequestError,
    WireOp,
    alter_client_quotas,
    describe_client_quotas,
    entity_from_wire,
    entity_to_wire,
    java_hash_order,
)
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import BUILT_IN_KEYS

PRODUCER = "producer_byte_rate"
CONSUMER = "consumer_byte_rate"
REQUEST = "request_percentage"
MUTATION = "controller_mutation_rate"
CONNECTION = "connection_creation_rate"

Quotas = dict[QuotaEntity, dict[QuotaKey, float]]
WireEntity = list[tuple[str, str | None]]


def alter(quotas: Quotas, entity: WireEntity, ops: Sequence[WireOp],
          validate_only: bool = False) -> AlterResult:
    return alter_client_quotas(quotas, [(entity, ops)], validate_only)


def set_op(key: str, value: float) -> WireOp:
    return (key, value, False)


def remove_op(key: str) -> WireOp:
    return (key, 0.0, True)


def describe_entity(quotas: Quotas, entity: WireEntity) -> dict[str, float] | None:
    """What `kafka-configs --describe` asks for one entity: exact/default components, strict."""
    components = [(kind, 1, None) if name is None else (kind, 0, name) for kind, name in entity]
    result = describe_client_quotas(quotas, components, strict=True)
    assert result.error_code == NONE and result.entries is not None
    if not result.entries:
        return None
    assert len(result.entries) == 1
    got_entity, values = result.entries[0]
    assert sorted(got_entity) == sorted(entity)
    return values


def assert_invalid(result: AlterResult, fragment: str) -> None:
    assert len(result.results) == 1
    code, message = result.results[0]
    assert code == INVALID_REQUEST
    assert message is not None and fragment in message, message


# ---- scenario 13: testAlterClientQuotasRequest ----


def test_alter_client_quotas_request() -> None:
    entity: WireEntity = [("user", "user"), ("client-id", "client-id")]
    quotas: Quotas = {}
    assert describe_entity(quotas, entity) is None

    # Add two configuration entries.
    result = alter(quotas, entity, [set_op(PRODUCER, 10000.0), set_op(CONSUMER, 20000.0)])
    assert result.results == [(NONE, None)]
    quotas = result.quotas
    assert describe_entity(quotas, entity) == {PRODUCER: 10000.0, CONSUMER: 20000.0}

    # Update an existing entry.
    quotas = alter(quotas, entity, [set_op(PRODUCER, 15000.0)]).quotas
    assert describe_entity(quotas, entity) == {PRODUCER: 15000.0, CONSUMER: 20000.0}

    # Remove an existing configuration entry.
    quotas = alter(quotas, entity, [remove_op(PRODUCER)]).quotas
    assert describe_entity(quotas, entity) == {CONSUMER: 20000.0}

    # Remove a non-existent configuration entry: no change, and still a success.
    result = alter(quotas, entity, [remove_op(REQUEST)])
    assert result.results == [(NONE, None)]
    assert result.changes == []
    quotas = result.quotas
    assert describe_entity(quotas, entity) == {CONSUMER: 20000.0}

    # Add back a deleted configuration entry.
    quotas = alter(quotas, entity, [set_op(PRODUCER, 5000.0)]).quotas
    assert describe_entity(quotas, entity) == {PRODUCER: 5000.0, CONSUMER: 20000.0}

    # Perform a mixed update.
    result = alter(quotas, entity, [set_op(PRODUCER, 20000.0), remove_op(CONSUMER), set_op(REQUEST, 12.3)])
    assert result.results == [(NONE, None)]
    quotas = result.quotas
    assert describe_entity(quotas, entity) == {PRODUCER: 20000.0, REQUEST: 12.3}
    uc = QuotaEntity(user="user", client_id="client-id")
    assert result.changes == [QuotaChange(uc, QuotaKey.PRODUCER_BYTE_RATE, 20000.0),
                              QuotaChange(uc, QuotaKey.CONSUMER_BYTE_RATE, None),
                              QuotaChange(uc, QuotaKey.REQUEST_PERCENTAGE, 12.3)]


def test_removing_the_last_key_removes_the_entity() -> None:
    entity = QuotaEntity(user="u")
    result = alter({entity: {QuotaKey.PRODUCER_BYTE_RATE: 100.0}}, [("user", "u")], [remove_op(PRODUCER)])
    assert result.quotas == {}
    assert describe_client_quotas(result.quotas, [], strict=False).entries == []


def test_input_mapping_is_not_modified() -> None:
    quotas: Quotas = {QuotaEntity(user="u"): {QuotaKey.PRODUCER_BYTE_RATE: 100.0}}
    alter(quotas, [("user", "u")], [set_op(PRODUCER, 200.0), set_op(CONSUMER, 300.0)])
    assert quotas == {QuotaEntity(user="u"): {QuotaKey.PRODUCER_BYTE_RATE: 100.0}}


def test_setting_the_same_value_is_no_change() -> None:
    quotas: Quotas = {QuotaEntity(user="u"): {QuotaKey.PRODUCER_BYTE_RATE: 100.0}}
    result = alter(quotas, [("user", "u")], [set_op(PRODUCER, 100.0)])
    assert result.results == [(NONE, None)]
    assert result.changes == []
    assert result.quotas == quotas


# ---- testAlterClientQuotasRequestValidateOnly ----


def test_validate_only_writes_nothing() -> None:
    entity: WireEntity = [("user", "user")]
    quotas = alter({}, entity, [set_op(PRODUCER, 20000.0), set_op(REQUEST, 23.45)]).quotas
    before = {PRODUCER: 20000.0, REQUEST: 23.45}
    assert describe_entity(quotas, entity) == before
    for ops in ([set_op(CONSUMER, 50000.0)],
                [set_op(PRODUCER, 10000.0)],
                [remove_op(REQUEST)],
                [set_op(PRODUCER, 10000.0), set_op(CONSUMER, 50000.0), remove_op(REQUEST)]):
        result = alter(quotas, entity, ops, validate_only=True)
        assert result.results == [(NONE, None)]
        assert result.changes == []
        assert result.quotas == quotas
        assert describe_entity(result.quotas, entity) == before


def test_validate_only_still_reports_errors() -> None:
    result = alter({}, [("user", "u")], [set_op(PRODUCER, 10000.5)], validate_only=True)
    assert_invalid(result, "cannot be a fractional value")


# ---- testAlterClientQuotasInvalidRequests, InvalidEntityCombination, BadIp ----


@pytest.mark.parametrize(("entity", "ops", "fragment"), [
    ([("user", "")], [set_op(REQUEST, 12.34)], "Empty user not supported"),
    ([("client-id", "")], [set_op(REQUEST, 12.34)], "Empty client-id not supported"),
    ([("", "name")], [set_op(REQUEST, 12.34)], "Unhandled client quota entity type: "),
    ([], [set_op(PRODUCER, 10000.5)], "Invalid empty client quota entity"),
    ([("user", "user")], [set_op("bad", 1.0)], "Invalid configuration key bad"),
    ([("user", "user")], [set_op(PRODUCER, 10000.5)], "producer_byte_rate cannot be a fractional value."),
    ([("user", "user"), ("ip", "1.2.3.4")], [set_op(REQUEST, 12.34)], "Invalid quota entity combination"),
    ([("client-id", "client"), ("ip", "1.2.3.4")], [set_op(REQUEST, 12.34)],
     "Invalid quota entity combination"),
    ([("ip", "not a valid host because it has spaces")], [set_op(CONNECTION, 50.0)], "not a valid IP"),
    ([("ip", "RFC2606.invalid")], [set_op(CONNECTION, 50.0)], "not a valid IP"),
], ids=["empty-user", "empty-client-id", "empty-type", "empty-entity", "bad-key", "fractional",
        "user-and-ip", "client-and-ip", "ip-with-spaces", "unresolvable-host"])
def test_invalid_alter_requests(entity: WireEntity, ops: list[WireOp], fragment: str) -> None:
    for validate_only in (True, False):
        result = alter({}, entity, ops, validate_only)
        assert_invalid(result, fragment)
        assert result.quotas == {} and result.changes == []


@pytest.mark.parametrize(("entity", "ops", "fragment"), [
    ([("user", "u"), ("user", "v")], [set_op(REQUEST, 1.0)],
     "Invalid client quota entity, duplicate entity entry user"),
    ([("group", "g")], [set_op(REQUEST, 1.0)], "Unhandled client quota entity type: group"),
    ([("user", DEFAULT)], [set_op(REQUEST, 1.0)], "reserved for the default entity"),
    ([("client-id", DEFAULT)], [set_op(REQUEST, 1.0)], "reserved for the default entity"),
    ([("ip", DEFAULT)], [set_op(CONNECTION, 1.0)], "reserved for the default entity"),
    ([("ip", "localhost")], [set_op(CONNECTION, 1.0)], "localhost is not a valid IP"),
    ([("user", "u")], [set_op(CONNECTION, 10.0)], "Invalid configuration key connection_creation_rate"),
    ([("ip", "1.2.3.4")], [set_op(PRODUCER, 10.0)], "Invalid configuration key producer_byte_rate"),
    ([("user", "u")], [set_op(PRODUCER, 0.0)], "Quota producer_byte_rate must be greater than 0"),
    ([("user", "u")], [set_op(REQUEST, -1.0)], "Quota request_percentage must be greater than 0"),
    ([("user", "u")], [set_op(PRODUCER, 2.0**64)],
     "Proposed value for producer_byte_rate is too large for a LONG."),
    ([("user", "u")], [set_op(CONSUMER, float("inf"))], "too large for a LONG."),
    ([("ip", "1.2.3.4")], [set_op(CONNECTION, 2.0**31)],
     "Proposed value for connection_creation_rate is too large for an INT."),
    ([("ip", None)], [set_op(CONNECTION, 1.5)], "connection_creation_rate cannot be a fractional value."),
    ([("user", "u")], [set_op(REQUEST, float("nan"))], "request_percentage must be a finite number"),
    ([("user", "u")], [set_op(MUTATION, float("inf"))], "controller_mutation_rate must be a finite number"),
    ([("user", "u")], [set_op(PRODUCER, 10.0), remove_op(PRODUCER)],
     "Duplicate quota key producer_byte_rate not updating quota for this entity user=u"),
], ids=["duplicate-type", "unknown-type", "literal-default-user", "literal-default-client",
        "literal-default-ip", "host-name", "ip-key-for-user", "client-key-for-ip", "zero", "negative",
        "too-large-long", "infinite-long", "too-large-int", "fractional-int", "nan", "infinite-double",
        "duplicate-key"])
def test_more_invalid_alter_requests(entity: WireEntity, ops: list[WireOp], fragment: str) -> None:
    result = alter({}, entity, ops)
    assert_invalid(result, fragment)
    assert result.quotas == {} and result.changes == []


def test_whole_number_limits_are_accepted() -> None:
    result = alter_client_quotas({}, [
        ([("user", "u")], [set_op(PRODUCER, float(2**62)), set_op(CONSUMER, 1.0)]),
        ([("ip", "::1")], [set_op(CONNECTION, float(2**31 - 1))]),
        ([("user", "v")], [set_op(PRODUCER, 10000.0000001)]),  # within Kafka's 1e-6 of a whole number
    ], validate_only=False)
    assert result.results == [(NONE, None)] * 3


def test_a_bad_op_fails_its_whole_entry_but_not_the_others() -> None:
    quotas: Quotas = {QuotaEntity(user="u"): {QuotaKey.PRODUCER_BYTE_RATE: 100.0}}
    result = alter_client_quotas(quotas, [
        ([("user", "u")], [set_op(CONSUMER, 50.0), set_op(PRODUCER, 0.5)]),
        ([("client-id", "c")], [set_op(REQUEST, 25.0)]),
    ], validate_only=False)
    assert result.results[0][0] == INVALID_REQUEST
    assert result.results[1] == (NONE, None)
    assert result.quotas == {QuotaEntity(user="u"): {QuotaKey.PRODUCER_BYTE_RATE: 100.0},
                             QuotaEntity(client_id="c"): {QuotaKey.REQUEST_PERCENTAGE: 25.0}}
    assert result.changes == [QuotaChange(QuotaEntity(client_id="c"), QuotaKey.REQUEST_PERCENTAGE, 25.0)]


def test_duplicate_entity_in_one_request_fails_every_occurrence() -> None:
    result = alter_client_quotas({}, [
        ([("user", "u"), ("client-id", "c")], [set_op(PRODUCER, 100.0)]),
        ([("ip", "10.0.0.1")], [set_op(CONNECTION, 5.0)]),
        ([("client-id", "c"), ("user", "u")], [set_op(CONSUMER, 200.0)]),  # same entity, other order
    ], validate_only=False)
    assert result.results[1] == (NONE, None)
    for index in (0, 2):
        assert result.results[index] == (INVALID_REQUEST,
                                         "Ignoring duplicate entity user=u, client-id=c")
    assert result.quotas == {QuotaEntity(ip="10.0.0.1"): {QuotaKey.CONNECTION_CREATION_RATE: 5.0}}


def test_removing_an_unknown_or_foreign_key_is_a_no_op() -> None:
    # Kafka validates nothing about a removed key; none of these can be set, so nothing changes.
    quotas: Quotas = {QuotaEntity(ip="1.2.3.4"): {QuotaKey.CONNECTION_CREATION_RATE: 5.0}}
    result = alter(quotas, [("ip", "1.2.3.4")], [remove_op("bad"), remove_op(PRODUCER)])
    assert result.results == [(NONE, None)]
    assert result.quotas == quotas and result.changes == []


def test_default_entities_and_ips() -> None:
    result = alter_client_quotas({}, [
        ([("user", None)], [set_op(PRODUCER, 1000.0)]),
        ([("user", None), ("client-id", None)], [set_op(REQUEST, 50.0)]),
        ([("ip", None)], [set_op(CONNECTION, 200.0)]),
        ([("ip", "2001:db8::1")], [set_op(CONNECTION, 150.0)]),
    ], validate_only=False)
    assert result.results == [(NONE, None)] * 4
    assert result.quotas == {
        QuotaEntity(user=DEFAULT): {QuotaKey.PRODUCER_BYTE_RATE: 1000.0},
        QuotaEntity(user=DEFAULT, client_id=DEFAULT): {QuotaKey.REQUEST_PERCENTAGE: 50.0},
        QuotaEntity(ip=DEFAULT): {QuotaKey.CONNECTION_CREATION_RATE: 200.0},
        QuotaEntity(ip="2001:db8::1"): {QuotaKey.CONNECTION_CREATION_RATE: 150.0},
    }


# ---- wire helpers ----


def test_wire_entity_round_trip() -> None:
    for entity in (QuotaEntity(user="u"), QuotaEntity(user=DEFAULT, client_id="c"),
                   QuotaEntity(client_id=DEFAULT), QuotaEntity(ip=DEFAULT), QuotaEntity(ip="1.2.3.4")):
        assert entity_from_wire(entity_to_wire(entity)) == entity
    assert entity_to_wire(QuotaEntity(user=DEFAULT, client_id="c")) == [("user", None), ("client-id", "c")]
    assert entity_from_wire([("client-id", "c"), ("user", None)]) == QuotaEntity(user=DEFAULT, client_id="c")
    with pytest.raises(QuotaRequestError) as info:
        entity_from_wire([])
    assert info.value.error_code == INVALID_REQUEST


# ---- DescribeClientQuotas: testDescribeClientQuotasMatchExact / MatchPartial ----

USER_CLIENT = {
    (("user", "user-1"), ("client-id", "client-id-1")): 50.50,
    (("user", "user-2"), ("client-id", "client-id-1")): 51.51,
    (("user", "user-3"), ("client-id", "client-id-2")): 52.52,
    (("user", None), ("client-id", "client-id-1")): 53.53,
    (("user", "user-1"), ("client-id", None)): 54.54,
    (("user", "user-3"), ("client-id", None)): 55.55,
    (("user", "user-1"),): 56.56,
    (("user", "user-2"),): 57.57,
    (("user", "user-3"),): 58.58,
    (("user", None),): 59.59,
    (("client-id", "client-id-2"),): 60.60,
}
IPS = {(("ip", "1.2.3.4"),): 10.0, (("ip", "2.3.4.5"),): 20.0}


@pytest.fixture
def match_quotas() -> Quotas:
    result = alter_client_quotas(
        {},
        [(list(entity), [set_op(REQUEST, value)]) for entity, value in USER_CLIENT.items()]
        + [(list(entity), [set_op(CONNECTION, value)]) for entity, value in IPS.items()],
        validate_only=False)
    assert all(r == (NONE, None) for r in result.results)
    return result.quotas


def matched(quotas: Quotas, components: list[tuple[str, int, str | None]], strict: bool) -> set[tuple]:
    result = describe_client_quotas(quotas, components, strict)
    assert result.error_code == NONE and result.error_message is None and result.entries is not None
    return {tuple(entity) for entity, _values in result.entries}


def test_describe_match_exact(match_quotas: Quotas) -> None:
    for entity, value in USER_CLIENT.items():
        assert describe_entity(match_quotas, list(entity)) == {REQUEST: value}
    not_matching: list[WireEntity] = [
        [("user", "user-1"), ("client-id", "client-id-2")],
        [("user", "user-3"), ("client-id", "client-id-1")],
        [("user", "user-2"), ("client-id", None)],
        [("user", "user-4")],
        [("user", None), ("client-id", "client-id-2")],
        [("client-id", "client-id-1")],
        [("client-id", "client-id-3")],
    ]
    for other in not_matching:
        assert describe_entity(match_quotas, other) is None


Predicate = Callable[[dict[str, str | None]], bool]


def where(predicate: Predicate) -> set[tuple]:
    return {entity for entity in (*USER_CLIENT, *IPS) if predicate(dict(entity))}


@pytest.mark.parametrize(("components", "strict", "predicate", "count"), [
    # Open-ended existing user, non-existent user, existing client-id, default user.
    ([("user", 0, "user-1")], False, lambda e: e.get("user", "") == "user-1", 3),
    ([("user", 0, "unknown")], False, lambda e: False, 0),
    ([("client-id", 0, "client-id-2")], False, lambda e: e.get("client-id", "") == "client-id-2", 2),
    ([("user", 1, None)], False, lambda e: "user" in e and e["user"] is None, 2),
    # Close-ended existing user; client-id with no entity of its own.
    ([("user", 0, "user-2")], True, lambda e: e.get("user", "") == "user-2" and "client-id" not in e, 1),
    ([("client-id", 0, "client-id-1")], True, lambda e: False, 0),
    # Type-only matches take names and defaults alike.
    ([("user", 2, None)], True, lambda e: "user" in e and "client-id" not in e, 4),
    ([("user", 2, None)], False, lambda e: "user" in e, 10),
    ([("client-id", 2, None)], True, lambda e: "client-id" in e and "user" not in e, 1),
    ([("client-id", 2, None)], False, lambda e: "client-id" in e, 7),
    ([("ip", 2, None)], False, lambda e: "ip" in e, 2),
    # Mixed: exact user with any client-id; default user with any client-id.
    ([("user", 0, "user-1"), ("client-id", 2, None)], True, lambda e: e.get("user", "") == "user-1"
     and "client-id" in e, 2),
    ([("user", 1, None), ("client-id", 2, None)], False, lambda e: "user" in e and e["user"] is None
     and "client-id" in e, 1),
    # Empty filter: everything when open-ended, nothing when strict.
    ([], False, lambda e: True, 13),
    ([], True, lambda e: False, 0),
], ids=["user-1", "unknown-user", "client-id-2", "default-user", "strict-user-2", "strict-client-id-1",
        "strict-any-user", "any-user", "strict-any-client", "any-client", "any-ip", "user-1-any-client",
        "default-user-any-client", "empty-open", "empty-strict"])
def test_describe_match_partial(match_quotas: Quotas, components: list[tuple[str, int, str | None]],
                                strict: bool, predicate: Predicate, count: int) -> None:
    expected = where(predicate)
    assert len(expected) == count
    assert matched(match_quotas, components, strict) == expected


def test_kafka_configs_describe_forms(match_quotas: Quotas) -> None:
    # --entity-type users --entity-name user-2
    assert matched(match_quotas, [("user", 0, "user-2")], True) == {(("user", "user-2"),)}
    # --entity-type users --entity-default
    assert matched(match_quotas, [("user", 1, None)], True) == {(("user", None),)}
    # --entity-type users (no name): every user-only entity, the default included
    assert matched(match_quotas, [("user", 2, None)], True) == {
        (("user", "user-1"),), (("user", "user-2"),), (("user", "user-3"),), (("user", None),)}
    # --entity-type users --entity-name user-1 --entity-type clients --entity-default
    assert matched(match_quotas, [("user", 0, "user-1"), ("client-id", 1, None)], True) == {
        (("user", "user-1"), ("client-id", None))}
    # --entity-type ips --entity-name 1.2.3.4
    assert matched(match_quotas, [("ip", 0, "1.2.3.4")], True) == {(("ip", "1.2.3.4"),)}


def test_describe_values_and_order_are_deterministic() -> None:
    quotas: Quotas = {
        QuotaEntity(user="b"): {QuotaKey.REQUEST_PERCENTAGE: 5.0, QuotaKey.PRODUCER_BYTE_RATE: 100.0},
        QuotaEntity(user=DEFAULT): {QuotaKey.CONSUMER_BYTE_RATE: 7.0},
        QuotaEntity(user="a", client_id="c"): {QuotaKey.CONTROLLER_MUTATION_RATE: 2.5},
        QuotaEntity(user="a"): {QuotaKey.PRODUCER_BYTE_RATE: 1.0},
        QuotaEntity(client_id="c"): {QuotaKey.CONSUMER_BYTE_RATE: 3.0},
    }
    result = describe_client_quotas(quotas, [], strict=False)
    assert result.entries == [
        ([("client-id", "c")], {CONSUMER: 3.0}),
        ([("user", None)], {CONSUMER: 7.0}),
        ([("user", "a")], {PRODUCER: 1.0}),
        ([("user", "a"), ("client-id", "c")], {MUTATION: 2.5}),
        ([("user", "b")], {PRODUCER: 100.0, REQUEST: 5.0}),
    ]
    # Values in the order Kafka's tools print them (java_hash_order), not QuotaKey's.
    assert list(result.entries[4][1]) == [REQUEST, PRODUCER]
    # Same answer whatever the mapping's insertion order.
    assert describe_client_quotas(dict(reversed(quotas.items())), [], strict=False) == result


def test_values_come_in_the_order_kafka_configs_prints_them_from_kafka() -> None:
    """What kafka-configs.sh printed against Kafka 4.4 for keys set in one --add-config
    (tests/integration/test_kafka_configs_tool.py compares it with the proxy's answer)."""
    assert java_hash_order([PRODUCER, REQUEST]) == [REQUEST, PRODUCER]  # one bucket of 4: 7 < 11 of 16
    assert java_hash_order([PRODUCER, CONSUMER]) == [CONSUMER, PRODUCER]
    assert java_hash_order([REQUEST, MUTATION]) == [MUTATION, REQUEST]
    assert java_hash_order([PRODUCER]) == [PRODUCER]
    # six keys: a table of 8 buckets
    assert java_hash_order([k.value for k in BUILT_IN_KEYS]) == [
        "connection_creation_rate", "producer_ids_rate", "producer_byte_rate", "consumer_byte_rate",
        "controller_mutation_rate", "request_percentage"]
    quotas: Quotas = {QuotaEntity(user=DEFAULT): {QuotaKey.PRODUCER_BYTE_RATE: 4194304.0,
                                                  QuotaKey.REQUEST_PERCENTAGE: 50.0}}
    entries = describe_client_quotas(quotas, [("user", 1, None)], strict=True).entries
    assert entries is not None and list(entries[0][1]) == [REQUEST, PRODUCER]


def test_describe_exact_literal_default_does_not_match_the_default() -> None:
    quotas: Quotas = {QuotaEntity(user=DEFAULT): {QuotaKey.PRODUCER_BYTE_RATE: 1.0}}
    assert matched(quotas, [("user", 0, DEFAULT)], True) == set()
    assert matched(quotas, [("user", 1, None)], True) == {(("user", None),)}


# ---- DescribeClientQuotas errors: testClientQuotasUnsupportedEntityTypes and the filter rules ----


@pytest.mark.parametrize(("components", "code", "message"), [
    ([("other", 0, "name")], UNSUPPORTED_VERSION, "Unsupported entity type other"),
    ([("", 0, "name")], INVALID_REQUEST, "Invalid empty entity type."),
    ([("user", 0, "a"), ("user", 2, None)], INVALID_REQUEST,
     "Entity type user cannot appear more than once in the filter."),
    ([("user", 0, None)], INVALID_REQUEST,
     "Request specified MATCH_TYPE_EXACT, but set match string to null."),
    ([("user", 1, "a")], INVALID_REQUEST,
     "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
    ([("user", 2, "a")], INVALID_REQUEST,
     "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."),
    ([("user", 3, None)], INVALID_REQUEST, "Unknown match type 3"),
    ([("ip", 2, None), ("user", 2, None)], INVALID_REQUEST,
     "Invalid entity filter component combination. IP filter component should not be used with user "
     "or clientId filter component."),
    ([("client-id", 0, "c"), ("ip", 1, None)], INVALID_REQUEST,
     "Invalid entity filter component combination."),
], ids=["unknown-type", "empty-type", "duplicate-type", "exact-null", "default-with-match",
        "specified-with-match", "unknown-match-type", "ip-and-user", "client-and-ip"])
def test_describe_errors(components: list[tuple[str, int, str | None]], code: int, message: str) -> None:
    quotas: Quotas = {QuotaEntity(user="u"): {QuotaKey.PRODUCER_BYTE_RATE: 1.0}}
    for strict in (True, False):
        result = describe_client_quotas(quotas, components, strict)
        assert result.error_code == code
        assert result.error_message is not None and result.error_message.startswith(message)
        assert result.entries is None


# ---- the topic entity type (topic quotas, the proxy's extension) ----


def test_topic_quotas_are_set_and_described_like_any_entity() -> None:
    result = alter_client_quotas({}, [
        ([("topic", "orders")], [set_op(PRODUCER, 1048576.0), set_op(CONSUMER, 2097152.0)]),
        ([("topic", None)], [set_op(PRODUCER, 524288.0)]),
        ([("user", "u")], [set_op(PRODUCER, 100.0)]),
    ], validate_only=False)
    assert result.results == [(NONE, None)] * 3
    assert result.quotas[QuotaEntity(topic="orders")] == {QuotaKey.PRODUCER_BYTE_RATE: 1048576.0,
                                                          QuotaKey.CONSUMER_BYTE_RATE: 2097152.0}
    assert result.quotas[QuotaEntity(topic=DEFAULT)] == {QuotaKey.PRODUCER_BYTE_RATE: 524288.0}
    described = describe_client_quotas(result.quotas, [("topic", 2, None)], strict=False)
    assert described.entries == [
        ([("topic", None)], {PRODUCER: 524288.0}),
        ([("topic", "orders")], {PRODUCER: 1048576.0, CONSUMER: 2097152.0}),
    ]
    exact = describe_client_quotas(result.quotas, [("topic", 0, "orders")], strict=True)
    assert exact.entries == [([("topic", "orders")], {PRODUCER: 1048576.0, CONSUMER: 2097152.0})]
    users = describe_client_quotas(result.quotas, [("user", 2, None)], strict=True)
    assert users.entries == [([("user", "u")], {PRODUCER: 100.0})]


@pytest.mark.parametrize(("entity", "ops", "fragment"), [
    ([("topic", "t"), ("user", "u")], [set_op(PRODUCER, 10.0)],
     "Invalid quota entity combination, topic entity should not be combined with User, ClientId or IP"),
    ([("topic", "t"), ("ip", "1.2.3.4")], [set_op(PRODUCER, 10.0)], "Invalid quota entity combination"),
    ([("topic", "t")], [set_op(REQUEST, 10.0)], "Invalid configuration key request_percentage"),
    ([("topic", "t")], [set_op(MUTATION, 10.0)], "Invalid configuration key controller_mutation_rate"),
    ([("topic", "t")], [set_op("producer_ids_rate", 10.0)],
     "producer_ids_rate applies to user entities alone"),
    ([("topic", "t")], [set_op(PRODUCER, 10.5)], "producer_byte_rate cannot be a fractional value."),
    ([("topic", "")], [set_op(PRODUCER, 10.0)], "Empty topic not supported"),
    ([("topic", DEFAULT)], [set_op(PRODUCER, 10.0)], "reserved for the default entity"),
], ids=["topic-and-user", "topic-and-ip", "request-key", "mutation-key", "producer-ids-key", "fractional",
        "empty", "literal-default"])
def test_invalid_topic_quotas(entity: WireEntity, ops: list[WireOp], fragment: str) -> None:
    result = alter({}, entity, ops)
    assert_invalid(result, fragment)
    assert result.quotas == {} and result.changes == []


def test_a_topic_filter_cannot_be_combined() -> None:
    result = describe_client_quotas({}, [("topic", 2, None), ("client-id", 2, None)], strict=False)
    assert result.error_code == INVALID_REQUEST
    assert result.error_message == ("Invalid entity filter component combination. Topic filter component "
                                    "should not be used with user, clientId or IP filter component.")
