"""Recommended quotas: a default for everyone and overrides for the outliers (KIP-13's "fixed
quotas for everyone but the top k outliers which can justify custom quotas").

The rule (percentile of the tenants' p99 demand, times headroom, rounded up) and the entities it
picks under Kafka's precedence: docs/analytics.md.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import yaml

from kafka_quota_proxy.analytics.measures import CLIENT_MEASURES, TOPIC_MEASURES, USER_MEASURES, Measure
from kafka_quota_proxy.analytics.readable import format_number, format_value, round_up_2sig, round_up_bytes
from kafka_quota_proxy.identity import ANONYMOUS
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import extension_keys, whole_number_keys

DEFAULT_PERCENTILE = 95.0
DEFAULT_HEADROOM = 1.5


@dataclass(frozen=True, slots=True)
class TenantDemand:
    """A tenant's p99 demand rate per client measure (measure name -> rate in its unit)."""

    user: str
    client_id: str
    p99: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class UserDemand:
    """A user's p99 hourly rate of each measure set per user alone (USER_MEASURES: new producer
    ids, in ids/s), by measure name."""

    user: str
    p99: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class TopicDemand:
    """A topic's p99 interval rate per direction ("produce", "fetch" -> B/s), every tenant and
    proxy instance together, and the share of its intervals in which its quota refused bytes."""

    topic: str
    p99: Mapping[str, float]
    refused_share: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Recommendation:
    """One recommended value: a key's default, or an override for one entity. `basis` is the
    demand it came from (the percentile for a default, the tenant's p99 for an override)."""

    measure: Measure
    entity: QuotaEntity
    value: float
    kind: str
    basis: float


@dataclass
class Recommendations:
    """The recommended quotas, with the rule's parameters and notes."""

    items: list[Recommendation]
    percentile: float
    headroom: float
    notes: list[str] = field(default_factory=list)

    @property
    def quotas(self) -> dict[QuotaEntity, dict[QuotaKey, float]]:
        """Entity -> {key: value}, in the order the items were made (defaults first)."""
        out: dict[QuotaEntity, dict[QuotaKey, float]] = {}
        for item in self.items:
            out.setdefault(item.entity, {})[item.measure.key] = item.value
        return out

    def overrides(self, measure: Measure, topics: bool = False) -> list[Recommendation]:
        """The overrides of a measure: for clients, or with `topics` for topics."""
        return [i for i in self.items if i.measure is measure and i.kind == "override"
                and (i.entity.topic is not None) == topics]

    def default(self, measure: Measure, topics: bool = False) -> Recommendation | None:
        return next((i for i in self.items if i.measure is measure and i.kind == "default"
                     and (i.entity.topic is not None) == topics), None)

    def to_yaml(self, source: str = "") -> str:
        return render_yaml(self, source)

    def to_kafka_configs(self) -> str:
        return render_kafka_configs(self)


def nearest_rank(values: Sequence[float], percentile: float) -> float:
    """The nearest-rank percentile: the smallest value with at least `percentile` % of the
    values at or below it (what Spark's percentile_approx returns on few values)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(percentile / 100 * len(ordered)))
    return ordered[rank - 1]


def readable(key: QuotaKey, value: float) -> float:
    return float(round_up_bytes(value)) if key in whole_number_keys() else round_up_2sig(value)


def entity_mode(users: Iterable[str]) -> str:
    """'client-id' when every tenant is ANONYMOUS, 'user+client-id' when none is, else 'mixed'."""
    anonymous = {u == ANONYMOUS for u in users}
    if anonymous == {True}:
        return "client-id"
    return "mixed" if anonymous == {True, False} else "user+client-id"


def default_entity(mode: str) -> QuotaEntity:
    if mode == "client-id":
        return QuotaEntity(client_id=DEFAULT)
    return QuotaEntity(user=DEFAULT, client_id=DEFAULT)


def override_entity(mode: str, user: str, client_id: str) -> QuotaEntity:
    if mode == "client-id":
        return QuotaEntity(client_id=client_id)
    return QuotaEntity(user=user, client_id=client_id)


def recommend(tenants: Sequence[TenantDemand], users: Sequence[UserDemand],
              percentile: float = DEFAULT_PERCENTILE, headroom: float = DEFAULT_HEADROOM,
              topics: Sequence[TopicDemand] = ()) -> Recommendations:
    """Defaults and overrides for every client measure, each measure set per user alone
    (producer_ids_rate) per user, and the topics' producer_byte_rate and consumer_byte_rate (from
    usage_log.topics) by the same rule."""
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    if not headroom > 0:
        raise ValueError(f"headroom must be positive, got {headroom}")
    result = Recommendations([], percentile, headroom)
    mode = entity_mode(t.user for t in tenants)
    for measure in CLIENT_MEASURES:
        _recommend_client_key(result, measure, tenants, mode)
    for measure in USER_MEASURES:
        _recommend_user_key(result, measure, users)
    for measure in TOPIC_MEASURES:
        _recommend_topic_key(result, measure, topics)
    return result


def _default(result: Recommendations, measure: Measure, entity: QuotaEntity, p99s: list[float]) -> float:
    """Add the default for `entity`: the percentile of the p99s x headroom, rounded up; returns it."""
    basis = nearest_rank(p99s, result.percentile)
    default = readable(measure.key, basis * result.headroom)
    result.items.append(Recommendation(measure, entity, default, "default", basis))
    return default


def _recommend_topic_key(result: Recommendations, measure: Measure, topics: Sequence[TopicDemand]) -> None:
    """As for a client key: a `<default>` topic quota at the percentile of the topics' p99, and an
    override for each topic above it. A topic whose quota refused bytes was held: its demand
    was more than the log shows, and a note says so."""
    active = [t for t in topics if t.p99.get(measure.name, 0) > 0]
    if not active:
        return
    key = measure.key
    default = _default(result, measure, QuotaEntity(topic=DEFAULT), [t.p99[measure.name] for t in active])
    for t in sorted(active, key=lambda t: t.topic):
        p99 = t.p99[measure.name]
        if p99 > default:
            result.items.append(Recommendation(measure, QuotaEntity(topic=t.topic),
                                               readable(key, p99 * result.headroom), "override", p99))
        refused = t.refused_share.get(measure.name, 0.0)
        if refused > 0:
            result.notes.append(
                f"topic {t.topic}: its {key.value} quota refused bytes in {refused:.0%} of its intervals; "
                f"its demand was above the p99 seen, {format_value(p99, measure.unit)}")


def _recommend_client_key(result: Recommendations, measure: Measure, tenants: Sequence[TenantDemand],
                          mode: str) -> None:
    active = [t for t in tenants if t.p99.get(measure.name, 0) > 0]
    if not active:
        return
    key = measure.key
    default = _default(result, measure, default_entity(mode), [t.p99[measure.name] for t in active])
    for t in sorted(active, key=lambda t: (t.user, t.client_id)):
        p99 = t.p99[measure.name]
        if p99 <= default:
            continue
        if not t.client_id or not t.user:
            result.notes.append(
                f"{t.user or '(no user)'}/{t.client_id or '(no client-id)'}: {measure.key.value} p99 "
                f"{format_value(p99, measure.unit)} is above the default, but Kafka's user+client-id and "
                "client-id quotas never apply to an empty client-id (or user): no override is possible")
            continue
        value = readable(key, p99 * result.headroom)
        result.items.append(Recommendation(measure, override_entity(mode, t.user, t.client_id), value,
                                           "override", p99))


def _recommend_user_key(result: Recommendations, measure: Measure, users: Sequence[UserDemand]) -> None:
    """As for a client key, per user: a `<default>` user quota and an override for each user above
    it; ANONYMOUS gets none (it is every unauthenticated client), but a note when above."""
    name = measure.name
    active = [u for u in users if u.user and u.user != ANONYMOUS and u.p99.get(name, 0) > 0]
    if not active:
        return
    key = measure.key
    default = _default(result, measure, QuotaEntity(user=DEFAULT), [u.p99[name] for u in active])
    for u in sorted(active, key=lambda u: u.user):
        if u.p99[name] > default:
            result.items.append(Recommendation(measure, QuotaEntity(user=u.user),
                                               readable(key, u.p99[name] * result.headroom), "override",
                                               u.p99[name]))
    anonymous = next((u for u in users if u.user == ANONYMOUS), None)
    if anonymous is not None and anonymous.p99.get(name, 0) > default:
        result.notes.append(
            f"ANONYMOUS: the {key.value} default applies to every unauthenticated client together, "
            f"whose p99 is {format_value(anonymous.p99[name], measure.unit)}, above the default "
            f"{format_number(default)}: it would be throttled")


# ---- rendering ------------------------------------------------------------------------------


def _yaml_name(name: str) -> str:
    # Plain when YAML reads it back as the same string (`<default>`, `alice`), quoted otherwise
    # (`"true"`, `"007"`, names with spaces or colons).
    try:
        if yaml.safe_load(f"k: {name}") == {"k": name}:
            return name
    except yaml.YAMLError:
        pass
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _comment(item: Recommendation, percentile: float, headroom: float) -> str:
    unit = item.measure.unit
    shown = format_value(item.value, unit) if unit == "B/s" else ""
    basis = format_value(item.basis, unit)
    topic = item.entity.topic is not None
    if item.kind == "default":
        of = "the topics' p99 rate" if topic else "the tenants' p99 demand"
        why = f"p{percentile:g} of {of}, {basis}, x {headroom:g}"
    else:
        why = f"override: p99 {'rate' if topic else 'demand'} {basis} x {headroom:g}"
    return f"{shown}; {why}" if shown else why


def render_yaml(recs: Recommendations, source: str = "") -> str:
    """A `quotas:` list the proxy loads (config file or `--quotas`), one entry per entity."""
    lines = ["# Recommended client quotas" + (f", from the usage log in {source}" if source else "") + ".",
             f"# default: p{recs.percentile:g} over tenants of their p99 interval demand, "
             f"x {recs.headroom:g}, rounded up;",
             "# override: a tenant whose p99 is above the default gets its p99 x "
             f"{recs.headroom:g}, rounded up."]
    if any(item.entity.topic is not None for item in recs.items):
        lines.append("# topics: the same rule over each topic's p99 interval rate, every client together.")
    for note in recs.notes:
        lines.append(f"# note: {note}")
    lines.append("quotas:" if recs.items else "quotas: []")
    by_entity: dict[QuotaEntity, list[Recommendation]] = {}
    for item in recs.items:
        by_entity.setdefault(item.entity, []).append(item)
    for entity, items in by_entity.items():
        parts = list(entity.items())
        for i, (kind, name) in enumerate(parts):
            lines.append(f"  {'- ' if i == 0 else '  '}{kind}: {_yaml_name(name)}")
        for item in items:
            lines.append(f"    {item.measure.key.value}: {format_number(item.value)}"
                         f"  # {_comment(item, recs.percentile, recs.headroom)}")
    return "\n".join(lines) + "\n"


ENTITY_TYPE_FLAGS = {"user": "users", "client-id": "clients", "ip": "ips", "topic": "topics"}


def kafka_configs_args(entity: QuotaEntity) -> list[str]:
    """The entity as kafka-configs.sh names it: users, then clients, each a name or the default;
    or a topic by name (the proxy takes the quota keys out of the topic's configs)."""
    args: list[str] = []
    for kind, name in entity.items():
        args += ["--entity-type", ENTITY_TYPE_FLAGS[kind]]
        args += ["--entity-default"] if name == DEFAULT else ["--entity-name", shlex.quote(name)]
    return args


def kafka_configs_command(entity: QuotaEntity, values: Mapping[QuotaKey, float]) -> str:
    config = ",".join(f"{k.value}={format_number(v)}" for k, v in values.items())
    return " ".join(["kafka-configs.sh", "--bootstrap-server", "${BOOTSTRAP:-localhost:9092}", "--alter",
                     *kafka_configs_args(entity), "--add-config", config])


def render_kafka_configs(recs: Recommendations) -> str:
    """The same quotas as `kafka-configs.sh --alter` commands, one per entity."""
    lines = ["#!/bin/sh",
             "# The recommended quotas as kafka-configs.sh commands, against the proxy or a Kafka cluster.",
             "# BOOTSTRAP=host:port sets the bootstrap server (default localhost:9092).",
             "set -e"]
    for entity, values in recs.quotas.items():
        if entity.topic == DEFAULT:
            config = ",".join(f"{k.value}={format_number(v)}" for k, v in values.items())
            lines.append(f"# topic <default>: {config}. kafka-configs.sh has no default topic: set it in "
                         "the proxy's quotas: (recommended-quotas.yaml) or with AlterClientQuotas, "
                         "entity type topic.")
            continue
        for key in sorted(extension_keys() & values.keys(), key=lambda k: k.value):
            lines.append(f"# {key.value} is the proxy's extension key (Kafka does not know it): "
                         "set it through the proxy.")
        if entity.topic is not None:
            lines.append("# A topic quota is the proxy's extension: run this against the proxy.")
        lines.append(kafka_configs_command(entity, values))
    return "\n".join(lines) + "\n"
