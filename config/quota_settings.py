"""The `quota:` section and the `quotas:` list of the config file.

    quota:
      scope: broker            # broker (default): a measurement per upstream broker, as Kafka;
                               # proxy: one measurement across every broker behind this proxy
      mode: enforce            # enforce | observe (measure, report, never throttle) | off
      window_num: 11           # quota.window.num
      window_size_seconds: 1   # quota.window.size.seconds
      exempt_principals: []    # never measured nor throttled (e.g. mirror makers)
      exempt_client_ids: []
      max_tracked_entities: 100000
      max_connections_per_ip: null
      state_file: null         # where quotas set through AlterClientQuotas are kept;
                               # default: <config file>.quota-state.json beside the config
      alter_principals: null   # who may AlterClientQuotas; null: every principal
    quotas:
      - client-id: producer-a
        producer_byte_rate: 1048576
      - user: <default>
        consumer_byte_rate: 2097152
      - ip: <default>
        connection_creation_rate: 20
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quota.entities import DEFAULT, QuotaEntity, QuotaKey

from .errors import ConfigError

SCOPES = ("broker", "proxy")
MODES = ("enforce", "observe", "off")
ENTITY_KEYS = {"user": "user", "client-id": "client_id", "ip": "ip"}


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    scope: str = "broker"
    mode: str = "enforce"
    window_num: int = 11
    window_size_seconds: int = 1
    exempt_principals: frozenset[str] = frozenset()
    exempt_client_ids: frozenset[str] = frozenset()
    max_tracked_entities: int = 100_000
    max_connections_per_ip: int | None = None
    state_file: str | None = None
    # Who may AlterClientQuotas through the proxy; None lets every principal (see the README).
    alter_principals: frozenset[str] | None = None

    @property
    def window_ms(self) -> int:
        return self.window_size_seconds * 1000


def _int(key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(key, f"expected a whole number >= {minimum}, got {value!r}")
    return value


def _names(key: str, value: Any) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(key, "expected a list of names")
    return frozenset(value)


def parse_quota_section(raw: Any) -> QuotaSettings:
    if raw is None:
        return QuotaSettings()
    if not isinstance(raw, dict):
        raise ConfigError("quota", "expected a mapping")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        full = f"quota.{key}"
        if key == "scope":
            if value not in SCOPES:
                raise ConfigError(full, f"expected one of {', '.join(SCOPES)}, got {value!r}")
            values["scope"] = value
        elif key == "mode":
            if value not in MODES:
                raise ConfigError(full, f"expected one of {', '.join(MODES)}, got {value!r}")
            values["mode"] = value
        elif key in ("window_num", "window_size_seconds", "max_tracked_entities"):
            values[key] = _int(full, value)
        elif key == "max_connections_per_ip":
            values[key] = None if value is None else _int(full, value, minimum=0)
        elif key in ("exempt_principals", "exempt_client_ids"):
            values[key] = _names(full, value)
        elif key == "alter_principals":
            values[key] = None if value is None else _names(full, value)
        elif key == "state_file":
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(full, "expected a file path")
            values[key] = value
        else:
            raise ConfigError(full, "unknown key (known: scope, mode, window_num, window_size_seconds, "
                              "exempt_principals, exempt_client_ids, max_tracked_entities, "
                              "max_connections_per_ip, state_file, alter_principals)")
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
            try:
                quota_key = QuotaKey(key)
            except ValueError:
                known = ", ".join([*ENTITY_KEYS, *(k.value for k in QuotaKey)])
                raise ConfigError(f"{where}.{key}", f"unknown key (known: {known})") from None
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
    from quota.admin_api import alter_client_quotas, entity_to_wire

    wire = [(entity_to_wire(e.entity), [(k.value, v, False) for k, v in e.values.items()])
            for e in entries]
    result = alter_client_quotas({}, wire, validate_only=False)
    for i, (code, message) in enumerate(result.results):
        if code:
            raise ConfigError(f"quotas[{i}]", message or f"error {code}", source)
    return result.quotas
