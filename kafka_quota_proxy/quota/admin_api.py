"""DescribeClientQuotas (API 48) and AlterClientQuotas (API 49), answered from plain data.

Pure: both functions take the current quotas as a mapping and return what to answer on the wire
and, for Alter, the new mapping and the changes. The caller decodes and encodes the messages,
checks authorization, persists and applies. The rules are Kafka's (KIP-546); the deliberate
differences, the `producer_ids_rate` extension and the `topic` entity type (topic quotas, which
Kafka brokers do not know): docs/differences-from-kafka.md.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kafka_quota_proxy.protocol.error_codes import INVALID_REQUEST, UNSUPPORTED_VERSION
from kafka_quota_proxy.quota.entities import DEFAULT, ENTITY_TYPES, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import key_named, keys_for, kind_of, user_only_keys

# Kafka error codes used by these two APIs.
NONE = 0

# Entity types on the wire (ClientQuotaEntity.USER / CLIENT_ID / IP), and the proxy's own TOPIC.
USER, CLIENT_ID, IP, TOPIC = ENTITY_TYPES

# DescribeClientQuotasRequest match types.
MATCH_TYPE_EXACT = 0
MATCH_TYPE_DEFAULT = 1
MATCH_TYPE_SPECIFIED = 2

# The largest value of each Java type of a whole-number key, and the type as Kafka's message
# names it. Kafka compares the double against the Java constant widened to double, so LONG's
# bound is 2**63 exactly.
_JAVA_MAX = {"LONG": (float(2**63 - 1), "a LONG"), "INT": (float(2**31 - 1), "an INT")}
_FRACTION_EPSILON = 1e-6  # ClientQuotaControlManager.getErrorForIntegralQuotaValue

WireEntity = Sequence[tuple[str, str | None]]
"""An entity as on the wire: (entity type, name), name None for the default entity."""
WireComponent = tuple[str, int, str | None]
"""A Describe filter component as on the wire: (entity type, match type, match)."""
WireOp = tuple[str, float, bool]
"""An Alter op as on the wire: (key, value, remove)."""
Quotas = Mapping[QuotaEntity, Mapping[QuotaKey, float]]


class QuotaRequestError(Exception):
    """A request these APIs refuse: the Kafka error code and the message to send back."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


@dataclass(frozen=True, slots=True)
class DescribeResult:
    """A DescribeClientQuotas answer. On error `entries` is None, as Kafka sends it."""

    error_code: int
    error_message: str | None
    entries: list[tuple[list[tuple[str, str | None]], dict[str, float]]] | None


@dataclass(frozen=True, slots=True)
class QuotaChange:
    """One key of one entity that an Alter changed: the new value, or None if removed."""

    entity: QuotaEntity
    key: QuotaKey
    value: float | None


@dataclass(frozen=True, slots=True)
class AlterResult:
    """An AlterClientQuotas outcome.

    `results` holds (error_code, error_message) per request entry, in request order. `quotas`
    is the full mapping after the alteration (equal to the input for validate_only or when
    every entry failed); `changes` lists what differs from the input, in request order, so a
    caller can record API changes separately from file-configured quotas.
    """

    results: list[tuple[int, str | None]]
    quotas: dict[QuotaEntity, dict[QuotaKey, float]]
    changes: list[QuotaChange] = field(default_factory=list)


# ---- wire form <-> QuotaEntity ----


def entity_to_wire(entity: QuotaEntity) -> list[tuple[str, str | None]]:
    """(entity type, name) pairs in the order user, client-id, ip; the default becomes None."""
    return [(kind, None if name == DEFAULT else name) for kind, name in entity.items()]


def entity_from_wire(components: WireEntity) -> QuotaEntity:
    """Validate a wire entity and build the QuotaEntity, or raise QuotaRequestError (42).

    The checks and messages are ClientQuotaControlManager's validateEntity and
    configKeysForEntityType, plus the proxy's own two (IP literals only, no literal
    `<default>`), explained in the module docstring.
    """
    if not components:
        raise QuotaRequestError(INVALID_REQUEST, "Invalid empty client quota entity")
    names: dict[str, str | None] = {}
    for entity_type, name in components:
        if entity_type in names:
            raise QuotaRequestError(
                INVALID_REQUEST, f"Invalid client quota entity, duplicate entity entry {entity_type}")
        if entity_type not in ENTITY_TYPES:
            raise QuotaRequestError(INVALID_REQUEST, f"Unhandled client quota entity type: {entity_type}")
        if name is not None and not name:
            raise QuotaRequestError(INVALID_REQUEST, f"Empty {entity_type} not supported")
        if name == DEFAULT:
            raise QuotaRequestError(
                INVALID_REQUEST,
                f"The {entity_type} name {DEFAULT} is reserved for the default entity; "
                "send a null name (kafka-configs --entity-default) to set the default")
        names[entity_type] = name
    if IP in names:
        if USER in names or CLIENT_ID in names:
            raise QuotaRequestError(
                INVALID_REQUEST,
                "Invalid quota entity combination, IP entity should not be combined with User or ClientId")
        ip = names[IP]
        if ip is not None and not _is_ip_literal(ip):
            raise QuotaRequestError(
                INVALID_REQUEST, f"{ip} is not a valid IP (the proxy accepts IP address literals only)")
    if TOPIC in names and len(names) > 1:
        raise QuotaRequestError(
            INVALID_REQUEST,
            "Invalid quota entity combination, topic entity should not be combined with User, ClientId or IP")

    def field_value(entity_type: str) -> str | None:
        if entity_type not in names:
            return None
        name = names[entity_type]
        return DEFAULT if name is None else name

    return QuotaEntity(user=field_value(USER), client_id=field_value(CLIENT_ID), ip=field_value(IP),
                       topic=field_value(TOPIC))


def entity_sort_key(entity: QuotaEntity) -> tuple[tuple[int, str], ...]:
    """A total order on entities: absent, then default, then names, field by field."""
    return tuple((0, "") if name is None else (1, "") if name == DEFAULT else (2, name)
                 for name in entity.names())


def _java_string_hash(text: str) -> int:
    """java.lang.String.hashCode, as an unsigned 32-bit number."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h


def java_hash_order(keys: Iterable[str]) -> list[str]:
    """`keys` in the order Kafka's tools print an entity's quota values when its keys were set
    together: a java.util.HashMap iterates by bucket (the spread hash masked by its table size),
    and keys that share a bucket come in the order they were put in. On a Kafka broker, the
    entity's values map (ClientQuotaDelta.apply) is filled from a changes map of 16 buckets, and
    the client reads the response into a HashMap sized for the same count, whose table is as
    large: so by bucket at that table size, then by bucket among 16."""
    def spread(key: str) -> int:
        h = _java_string_hash(key)
        return h ^ (h >> 16)

    ordered = list(keys)
    size = 2  # the smallest table a HashMap holding `count` entries grows to (load factor 0.75)
    while len(ordered) > size * 3 // 4:
        size *= 2
    return sorted(ordered, key=lambda key: (spread(key) & (size - 1), spread(key) & 15, key))


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


# ---- DescribeClientQuotas ----

_ANY = object()  # a specified-type match: any name, the default included


def describe_client_quotas(
    quotas: Quotas, components: Sequence[WireComponent], strict: bool
) -> DescribeResult:
    """Answer a DescribeClientQuotas request from `quotas` (ClientQuotasImage.describe).

    A component matches an entity that has that entity type and, for exact and default
    matches, that name (None = default); a specified-type match takes any name, the default
    included. Every component must match. With `strict`, the entity must also have no other
    types. No components matches everything, or nothing when strict.
    """
    try:
        filters = _parse_filter(components)
    except QuotaRequestError as e:
        return DescribeResult(e.error_code, e.message, None)
    entries = []
    for entity in sorted(quotas, key=entity_sort_key):
        values = quotas[entity]
        if not values:
            continue
        wire = dict(entity_to_wire(entity))
        if strict and len(wire) != len(filters):
            continue
        if all(entity_type in wire and (match is _ANY or wire[entity_type] == match)
               for entity_type, match in filters.items()):
            entries.append((entity_to_wire(entity),
                            {key: float(values[QuotaKey(key)])
                             for key in java_hash_order(key.value for key in values)}))
    return DescribeResult(NONE, None, entries)


def _parse_filter(components: Sequence[WireComponent]) -> dict[str, object]:
    """entity type -> the name to match (None = default) or _ANY; raises QuotaRequestError."""
    filters: dict[str, object] = {}
    for entity_type, match_type, match in components:
        if not entity_type:
            raise QuotaRequestError(INVALID_REQUEST, "Invalid empty entity type.")
        if entity_type in filters:
            raise QuotaRequestError(
                INVALID_REQUEST, f"Entity type {entity_type} cannot appear more than once in the filter.")
        if entity_type not in ENTITY_TYPES:
            raise QuotaRequestError(UNSUPPORTED_VERSION, f"Unsupported entity type {entity_type}")
        if match_type == MATCH_TYPE_EXACT:
            if match is None:
                raise QuotaRequestError(
                    INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set match string to null.")
            filters[entity_type] = match
        elif match_type == MATCH_TYPE_DEFAULT:
            if match is not None:
                raise QuotaRequestError(
                    INVALID_REQUEST,
                    "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.")
            filters[entity_type] = None
        elif match_type == MATCH_TYPE_SPECIFIED:
            if match is not None:
                raise QuotaRequestError(
                    INVALID_REQUEST,
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.")
            filters[entity_type] = _ANY
        else:
            raise QuotaRequestError(INVALID_REQUEST, f"Unknown match type {match_type}")
    if IP in filters and (USER in filters or CLIENT_ID in filters):
        raise QuotaRequestError(
            INVALID_REQUEST,
            "Invalid entity filter component combination. IP filter component should not be used "
            "with user or clientId filter component.")
    if TOPIC in filters and len(filters) > 1:
        raise QuotaRequestError(
            INVALID_REQUEST,
            "Invalid entity filter component combination. Topic filter component should not be used "
            "with user, clientId or IP filter component.")
    return filters


# ---- AlterClientQuotas ----


def alter_client_quotas(
    quotas: Quotas,
    entries: Sequence[tuple[WireEntity, Sequence[WireOp]]],
    validate_only: bool,
) -> AlterResult:
    """Apply an AlterClientQuotas request to a copy of `quotas` (ClientQuotaControlManager).

    Each entry is all-or-nothing: one bad op fails the entry and none of its ops apply; other
    entries still apply. Removing a key that is not set is a no-op, and an entity left with
    no keys disappears. Every error is INVALID_REQUEST (42).
    """
    parsed: list[QuotaEntity | QuotaRequestError] = []
    for wire_entity, _ops in entries:
        try:
            parsed.append(entity_from_wire(wire_entity))
        except QuotaRequestError as e:
            parsed.append(e)
    seen: dict[QuotaEntity, int] = {}
    for entity in parsed:
        if isinstance(entity, QuotaEntity):
            seen[entity] = seen.get(entity, 0) + 1

    new = {entity: dict(values) for entity, values in quotas.items() if values}
    results: list[tuple[int, str | None]] = []
    changes: list[QuotaChange] = []
    for entity, (_wire_entity, ops) in zip(parsed, entries, strict=True):
        if isinstance(entity, QuotaRequestError):
            results.append((entity.error_code, entity.message))
            continue
        if seen[entity] > 1:
            results.append((INVALID_REQUEST, f"Ignoring duplicate entity {entity.describe()}"))
            continue
        try:
            alterations = _validate_ops(entity, ops)
        except QuotaRequestError as e:
            results.append((e.error_code, e.message))
            continue
        results.append((NONE, None))
        current = new.get(entity, {})
        for key, value in alterations:
            if value is None:
                if key in current:
                    del current[key]
                    changes.append(QuotaChange(entity, key, None))
            elif current.get(key) != value:
                current[key] = value
                changes.append(QuotaChange(entity, key, value))
        if current:
            new[entity] = current
        else:
            new.pop(entity, None)

    if validate_only:
        return AlterResult(results, {entity: dict(values) for entity, values in quotas.items() if values})
    return AlterResult(results, new, changes)


def _validate_ops(entity: QuotaEntity, ops: Sequence[WireOp]) -> list[tuple[QuotaKey, float | None]]:
    """The entry's ops as (key, value or None to remove); raises QuotaRequestError."""
    valid_keys = keys_for(entity)
    seen: set[str] = set()
    alterations: list[tuple[QuotaKey, float | None]] = []
    for key_name, value, remove in ops:
        if key_name in seen:
            raise QuotaRequestError(
                INVALID_REQUEST,
                f"Duplicate quota key {key_name} not updating quota for this entity {entity.describe()}")
        seen.add(key_name)
        key = _quota_key(key_name)
        if remove:
            # Kafka validates nothing about a removed key: one it does not know cannot be set,
            # so removing it is the no-op of removing an absent key.
            if key is not None and key in valid_keys:
                alterations.append((key, None))
            continue
        if key in user_only_keys() and key not in valid_keys:
            raise QuotaRequestError(INVALID_REQUEST, f"{key_name} applies to user entities alone "
                                                     f"(a user or the default user, no client-id)")
        if key is None or key not in valid_keys:
            raise QuotaRequestError(INVALID_REQUEST, f"Invalid configuration key {key_name}")
        validate_value(key, value)
        alterations.append((key, float(value)))
    return alterations


def validate_value(key: QuotaKey, value: float) -> None:
    """ClientQuotaControlManager.validateQuotaKeyValue, then the proxy's finiteness check."""
    if value <= 0.0:
        raise QuotaRequestError(INVALID_REQUEST, f"Quota {key.value} must be greater than 0")
    kind = kind_of(key)
    if kind.whole_number:
        limit, java_type = _JAVA_MAX[kind.value_type]
        if value > limit:
            raise QuotaRequestError(
                INVALID_REQUEST, f"Proposed value for {key.value} is too large for {java_type}.")
        # Kafka's test: the remainder, not the distance to the nearest whole number.
        if abs(math.fmod(value, 1.0)) > _FRACTION_EPSILON:
            raise QuotaRequestError(INVALID_REQUEST, f"{key.value} cannot be a fractional value.")
    if not math.isfinite(value):
        raise QuotaRequestError(INVALID_REQUEST, f"Quota {key.value} must be a finite number")


def _quota_key(name: str) -> QuotaKey | None:
    return key_named(name)
