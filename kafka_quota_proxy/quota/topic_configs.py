"""Topic quotas as topic configs, the way `kafka-configs.sh --entity-type topics` handles a topic.

kafka-configs.sh alters a topic with IncrementalAlterConfigs (DELETE and SET ops on a TOPIC
resource), after a DescribeConfigs of the topic that must list every config it deletes with the
source DYNAMIC_TOPIC_CONFIG; it describes a topic with DescribeConfigs, keeping the entries of that
source. So the proxy takes the ops on the topic quota keys out of IncrementalAlterConfigs and adds
those keys to the topic's DescribeConfigs entries; the broker sees and answers everything else.

Pure: plain values in, plain answers out. The stage decodes and encodes the messages, authorizes,
applies the ops through AlterClientQuotas' path and merges with the broker's answer
(proxy/stages/topic_configs.py). A resource is all or nothing, as on a broker: an op the proxy
refuses fails the whole resource, and none of it reaches the broker.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kafka_quota_proxy.protocol.error_codes import INVALID_CONFIG, INVALID_REQUEST
from kafka_quota_proxy.quota.admin_api import QuotaRequestError, WireEntity, WireOp, validate_value
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaKey
from kafka_quota_proxy.quota.kinds import kind_of, topic_keys

TOPIC_RESOURCE = 2  # ConfigResource.Type.TOPIC
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # AlterConfigOp.OpType
DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs' ConfigSource of a topic's own config
LONG = 5  # DescribeConfigs' ConfigType: the keys are Kafka's LONG quota configs
QUOTA_CONFIGS = frozenset(key.value for key in topic_keys())
# Both names end so: a request without these bytes has no quota key, and is not decoded.
MARKER = b"_byte_rate"
assert all(name.endswith(MARKER.decode()) for name in QUOTA_CONFIGS)
DOCUMENTATION = {key.value: kind_of(key).topic_doc for key in topic_keys()}  # as DescribeConfigs gives it

WireConfig = tuple[str, int, str | None]
"""An IncrementalAlterConfigs op as on the wire: (config name, operation, value)."""
_LONG_TEXT = re.compile(r"[+-]?[0-9]+")  # what Java's Long.parseLong reads
_OP_NAMES = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}


def topic_entity(name: str) -> WireEntity:
    """The AlterClientQuotas entity of a named topic."""
    return [("topic", name)]


def has_quota_configs(configs: Sequence[WireConfig]) -> bool:
    return any(name in QUOTA_CONFIGS for name, _, _ in configs)


@dataclass(frozen=True, slots=True)
class TopicAlteration:
    """One TOPIC resource split: its quota ops as AlterClientQuotas ops on the topic, and how many
    of its ops are the broker's."""

    ops: list[WireOp]
    broker_ops: int


def split_resource(name: str, configs: Sequence[WireConfig]) -> TopicAlteration:
    """A TOPIC resource's quota ops as AlterClientQuotas ops, or QuotaRequestError with what a
    broker answers the resource with: INVALID_REQUEST for its shape (Kafka's checks, over the
    whole resource), INVALID_CONFIG for a quota op (the value's check is AlterClientQuotas')."""
    _check_shape(configs)
    if not name:
        raise QuotaRequestError(INVALID_REQUEST, "Default topic resources are not allowed.")
    if name == DEFAULT:
        raise QuotaRequestError(
            INVALID_REQUEST, f"{DEFAULT} is not a topic: set the default topic quota with "
                             "AlterClientQuotas (entity type topic, null name) or in the config file")
    ops: list[WireOp] = []
    for config, op, value in configs:
        if config not in QUOTA_CONFIGS:
            continue
        if op == DELETE:
            ops.append((config, 0.0, True))
        elif op == SET:
            assert value is not None  # _check_shape
            ops.append((config, _quota_value(config, value), False))
        else:
            raise QuotaRequestError(
                INVALID_CONFIG, f"Can't {_OP_NAMES[op]} to key {config} because its type is not LIST.")
    return TopicAlteration(ops, len(configs) - len(ops))


def _check_shape(configs: Sequence[WireConfig]) -> None:
    """ConfigAdminManager's checks of a resource before anything is applied."""
    names = [name for name, _, _ in configs]
    if len(set(names)) != len(names):
        raise QuotaRequestError(INVALID_REQUEST, "Error due to duplicate config keys")
    nulls = [name for name, op, value in configs if op != DELETE and value is None]
    if nulls:
        raise QuotaRequestError(INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}")
    for _, op, _ in configs:
        if op not in _OP_NAMES:
            raise QuotaRequestError(INVALID_REQUEST, f"Unknown alter config operation type {op}")


def _quota_value(config: str, text: str) -> float:
    """The value of a SET: a LONG, as a broker parses a LONG topic config (surrounding blanks
    allowed), then AlterClientQuotas' checks of a topic's byte rate."""
    stripped = text.strip(" \t\n\r\f\v\x00")
    number = int(stripped) if _LONG_TEXT.fullmatch(stripped) else None
    if number is None or not -(2**63) <= number < 2**63:
        raise QuotaRequestError(INVALID_CONFIG,
                                f"Invalid value {text} for configuration {config}: Not a number of type LONG")
    try:
        validate_value(QuotaKey(config), float(number))
    except QuotaRequestError as e:
        raise QuotaRequestError(INVALID_CONFIG, e.message) from None
    return float(number)


def resource_conflicts(resources: Sequence[tuple[int, str]]) -> set[int]:
    """Indexes of resources that appear more than once: a broker refuses each of them
    (INVALID_REQUEST, "Each resource must appear at most once.")."""
    seen: dict[tuple[int, str], list[int]] = {}
    for index, resource in enumerate(resources):
        seen.setdefault(resource, []).append(index)
    return {i for indexes in seen.values() if len(indexes) > 1 for i in indexes}


DUPLICATE_RESOURCE = "Each resource must appear at most once."


@dataclass(slots=True)
class AlterPlan:
    """An IncrementalAlterConfigs request split between the proxy and the broker, kept for its
    response: per request resource, (type, name) and the proxy's answer, or None where the
    broker answers; and the quota ops that wait for the broker to accept the rest of their
    resource (by request index)."""

    resources: list[tuple[int, str]]
    answers: list[tuple[int, str | None] | None]
    after_broker: dict[int, list[WireOp]] = field(default_factory=dict)
    validate_only: bool = False


def merge_answers(plan: AlterPlan, broker: Sequence[tuple[int, str, int, str | None]]
                  ) -> list[tuple[int, str, int, str | None]]:
    """The response's results in the request's order: (type, name, error code, message) each,
    the proxy's where it answered and the broker's, matched by resource, elsewhere. Broker
    results that match no forwarded resource are kept, at the end."""
    pending: dict[tuple[int, str], list[tuple[int, str, int, str | None]]] = {}
    for result in broker:
        pending.setdefault((result[0], result[1]), []).append(result)
    merged = []
    for (kind, name), answer in zip(plan.resources, plan.answers, strict=True):
        if answer is not None:
            merged.append((kind, name, *answer))
        elif pending.get((kind, name)):
            merged.append(pending[(kind, name)].pop(0))
    merged += [result for results in pending.values() for result in results]
    return merged


@dataclass(frozen=True, slots=True)
class DescribeAdditions:
    """What a DescribeConfigs response gains: per topic name, its quota entries, (name, value);
    and whether the request asked for synonyms and documentation."""

    entries: dict[str, list[tuple[str, str]]]
    synonyms: bool
    documentation: bool


def describe_entries(values: Mapping[QuotaKey, float], asked: Sequence[str] | None) -> list[tuple[str, str]]:
    """The topic's quota entries a DescribeConfigs of it shows: every key set on it when the
    request asked for all configs (null or empty, as a broker reads both), else those it named;
    the value a whole number."""
    return [(key.value, str(int(values[key]))) for key in sorted(topic_keys())
            if key in values and (not asked or key.value in asked)]
