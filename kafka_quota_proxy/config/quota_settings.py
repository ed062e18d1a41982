"""The `quota:` section and the `quotas:` list of the config file, parsed and validated.

Every key with its default: docs/configuration.md; what they mean: docs/quotas.md and
docs/producer-id-quotas.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.validators import boolean, file_path, mapping, names, one_of, whole_number
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import key_named, key_names

SCOPES = ("broker", "proxy", "cluster")
MODES = ("enforce", "observe", "off")
ENTITY_KEYS = {"user": "user", "client-id": "client_id", "ip": "ip", "topic": "topic"}
PRODUCER_ID_ACTIONS = ("throttle", "reject")
# What a Produce's partitions of a topic over its quota fail with (docs/topic-quotas.md):
# NOT_ENOUGH_REPLICAS, which every client measured retries, or the truthful
# THROTTLING_QUOTA_EXCEEDED, which librdkafka and aiokafka fail the records with.
TOPIC_REFUSALS = ("not_enough_replicas", "throttling_quota_exceeded")
# What a ShareFetch over its consumer byte rate gets (docs/quotas.md, "Share groups"): `deliver`,
# its records with the throttle, the connection then muted for it; or `empty`, Kafka 4.4's own
# answer, no records, which leaves the records the broker acquired for it locked until their
# lock times out (30 s by default), so the consumer stalls far below its quota.
SHARE_FETCH_THROTTLES = ("deliver", "empty")
# How a byte-rate quota (producer_byte_rate, consumer_byte_rate) is held (docs/quotas.md, "Many
# connections"): `kafka`, Kafka's throttle formula and KIP-219 muting of the connection whose
# request went over; or `paced`, every connection of the entity let in at its quota.
BYTE_RATE_ENFORCEMENTS = ("kafka", "paced")


@dataclass(frozen=True, slots=True)
class ProducerIdSettings:
    """The producer-id quota (KIP-936): how new ids are measured, remembered and refused.

    Window and cleanup defaults are the KIP's proposed broker configs. The filter shape and the
    caps are the proxy's (the KIP leaves them open). Every filter has the same m bits: enough for
    `expected_ids_per_window` ids at `false_positive_rate`, but at most `max_bits_per_user`
    (9,586 bits, 1,199 bytes, with these defaults). A user holds at most two filters and at most
    `max_users` users are tracked, so the cache holds at most max_users * 2 * m / 8 bytes of
    bits: 24 MB with these defaults, scope by scope.
    """

    action: str = "throttle"
    window_num: int = 11
    window_size_seconds: int = 3600
    cleanup_interval_ms: int = 10
    expected_ids_per_window: int = 1000
    false_positive_rate: float = 0.01
    max_users: int = 10_000
    max_bits_per_user: int = 1 << 17

    @property
    def window_ms(self) -> int:
        return self.window_size_seconds * 1000

    # Changing these changes the measurement or the filters' shape: they need a restart.
    SHAPE = ("window_num", "window_size_seconds", "expected_ids_per_window", "false_positive_rate",
             "max_users", "max_bits_per_user", "cleanup_interval_ms")


def parse_producer_ids(raw: Any) -> ProducerIdSettings:
    if raw is None:
        return ProducerIdSettings()
    raw = mapping("quota.producer_ids", raw)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        full = f"quota.producer_ids.{key}"
        if key == "action":
            values[key] = one_of(full, value, PRODUCER_ID_ACTIONS)
        elif key in ("window_num", "window_size_seconds", "cleanup_interval_ms", "expected_ids_per_window",
                     "max_bits_per_user"):
            values[key] = whole_number(full, value)
        elif key == "max_users":
            values[key] = whole_number(full, value, minimum=0)
        elif key == "false_positive_rate":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
                raise ConfigError(full, f"expected a number between 0 and 1 (exclusive), got {value!r}")
            values[key] = float(value)
        else:
            raise ConfigError(full, "unknown key (known: action, window_num, window_size_seconds, "
                              "cleanup_interval_ms, expected_ids_per_window, false_positive_rate, "
                              "max_users, max_bits_per_user)")
    return ProducerIdSettings(**values)


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    """The `quota:` section: scope, mode, windows, exemptions, caps, state file, producer ids."""

    scope: str = "broker"
    mode: str = "enforce"
    window_num: int = 11
    window_size_seconds: int = 1
    exempt_principals: frozenset[str] = frozenset()
    exempt_client_ids: frozenset[str] = frozenset()
    max_tracked_entities: int = 100_000
    max_connections_per_ip: int | None = None
    state_file: str | None = None
    # Who may manage quotas through the proxy (docs/quotas.md, "Who may change quotas"). Alter
    # is Kafka's ALTER_CONFIGS on the cluster, describe its DESCRIBE_CONFIGS; "*" is everyone.
    # alter_principals None: not set, so nobody (and the first refusal says what to set).
    alter_principals: frozenset[str] | None = None
    describe_principals: frozenset[str] = frozenset()  # beside the alter principals
    # ANONYMOUS callers from a loopback address may also manage quotas, while no listener
    # authenticates clients (no SASL, no client certificates).
    anonymous_loopback: bool = True
    producer_ids: ProducerIdSettings = ProducerIdSettings()
    topic_refusal: str = "not_enough_replicas"
    share_fetch_throttle: str = "deliver"
    byte_rate_enforcement: str = "kafka"

    @property
    def window_ms(self) -> int:
        return self.window_size_seconds * 1000


def parse_quota_section(raw: Any) -> QuotaSettings:
    if raw is None:
        return QuotaSettings()
    raw = mapping("quota", raw)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        full = f"quota.{key}"
        if key == "scope":
            values["scope"] = one_of(full, value, SCOPES)
        elif key == "mode":
            values["mode"] = one_of(full, value, MODES)
        elif key in ("window_num", "window_size_seconds", "max_tracked_entities"):
            values[key] = whole_number(full, value)
        elif key == "max_connections_per_ip":
            values[key] = None if value is None else whole_number(full, value, minimum=0)
        elif key in ("exempt_principals", "exempt_client_ids"):
            values[key] = names(full, value)
        elif key == "alter_principals":
            values[key] = None if value is None else names(full, value)
        elif key == "describe_principals":
            values[key] = frozenset() if value is None else names(full, value)
        elif key == "anonymous_loopback":
            values[key] = boolean(full, value)
        elif key == "producer_ids":
            values[key] = parse_producer_ids(value)
        elif key == "state_file":
            values[key] = file_path(full, value)
        elif key == "topic_refusal":
            values[key] = one_of(full, value, TOPIC_REFUSALS)
        elif key == "share_fetch_throttle":
            values[key] = one_of(full, value, SHARE_FETCH_THROTTLES)
        elif key == "byte_rate_enforcement":
            values[key] = one_of(full, value, BYTE_RATE_ENFORCEMENTS)
        else:
            raise ConfigError(full, "unknown key (known: scope, mode, window_num, window_size_seconds, "
                              "exempt_principals, exempt_client_ids, max_tracked_entities, "
                              "max_connections_per_ip, state_file, alter_principals, describe_principals, "
                              "anonymous_loopback, producer_ids, topic_refusal, share_fetch_throttle, "
                              "byte_rate_enforcement)")
    return QuotaSettings(**values)


@dataclass(frozen=True, slots=True)
class QuotaEntry:
    """One entry of the `quotas:` list, before validation of its values against Kafka's rules."""

    entity: QuotaEntity
    values: Mapping[QuotaKey, float] = field(default_factory=dict)


def parse_quota_list(raw: Any) -> list[QuotaEntry]:
    """Shape checks only; `quota.admin_api` applies Kafka's value rules to the result."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError("quotas", "expected a list of entries")
    entries = []
    for i, item in enumerate(raw):
        where = f"quotas[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(where, "expected a mapping such as "
                              "{client-id: app, producer_byte_rate: 1048576}")
        names: dict[str, str] = {}
        values: dict[QuotaKey, float] = {}
        for key, value in item.items():
            if key in ENTITY_KEYS:
                if not isinstance(value, str | int) or isinstance(value, bool) or str(value) == "":
                    raise ConfigError(f"{where}.{key}", f"expected a name or {DEFAULT}, got {value!r}")
                names[ENTITY_KEYS[key]] = str(value)
                continue
            quota_key = key_named(key)
            if quota_key is None:
                known = ", ".join([*ENTITY_KEYS, *key_names()])
                raise ConfigError(f"{where}.{key}", f"unknown key (known: {known})")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{where}.{key}", f"expected a number, got {value!r}")
            values[quota_key] = float(value)
        try:
            entity = QuotaEntity(**names)
        except ValueError as exc:
            raise ConfigError(where, str(exc)) from None
        if not values:
            raise ConfigError(where, "sets no quota (add e.g. producer_byte_rate: 1048576)")
        entries.append(QuotaEntry(entity, values))
    return entries


def default_state_file(config_path: str | Path | None, settings: QuotaSettings) -> Path | None:
    if settings.state_file:
        return Path(settings.state_file)
    if config_path is None:
        return None
    path = Path(config_path)
    return path.with_name(path.name + ".quota-state.json")


def validate_quota_entries(entries: tuple[QuotaEntry, ...] | list[QuotaEntry],
                           source: str | None = None) -> dict[QuotaEntity, dict[QuotaKey, float]]:
    """Apply Kafka's AlterClientQuotas rules to the `quotas:` list, so a file can hold exactly
    what `kafka-configs.sh --alter` would accept."""
    from kafka_quota_proxy.quota.admin_api import alter_client_quotas, entity_to_wire

    wire = [(entity_to_wire(e.entity), [(k.value, v, False) for k, v in e.values.items()])
            for e in entries]
    result = alter_client_quotas({}, wire, validate_only=False)
    for i, (code, message) in enumerate(result.results):
        if code:
            raise ConfigError(f"quotas[{i}]", message or f"error {code}", source)
    return result.quotas
