"""Quotas set through AlterClientQuotas, kept in a JSON file so they survive a restart.

The API layer records what the API set and what it removed (tombstones); the effective quotas
are the file's, overridden key by key by it. The file is replaced atomically. How the two
sources combine, and the format: docs/quotas.md.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka_quota_proxy.config.atomic_file import write_atomically
from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import MISSING, load_document
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import key_named

STATE_KEY = "quota_state"
STATE_VERSION = 1
# (name in the file, QuotaEntity field)
_ENTITY_FIELDS = (("user", "user"), ("client-id", "client_id"), ("ip", "ip"), ("topic", "topic"))


@dataclass(slots=True)
class ApiQuotaLayer:
    """The quotas the API set (`values`) and the keys it removed (`removed`), per entity.

    A key is in at most one of the two: setting it clears its tombstone, removing it drops
    its value. Entities with nothing left are dropped from both.
    """

    values: dict[QuotaEntity, dict[QuotaKey, float]] = field(default_factory=dict)
    removed: dict[QuotaEntity, set[QuotaKey]] = field(default_factory=dict)

    def apply(self, entity: QuotaEntity, key: QuotaKey, value: float | None) -> None:
        """Record one API change: a new value, or None for a removal."""
        if value is None:
            _discard_value(self.values, entity, key)
            self.removed.setdefault(entity, set()).add(key)
        else:
            self.values.setdefault(entity, {})[key] = value
            tombstones = self.removed.get(entity)
            if tombstones is not None:
                tombstones.discard(key)
                if not tombstones:
                    del self.removed[entity]

    def merge_over(
        self, file_quotas: Mapping[QuotaEntity, Mapping[QuotaKey, float]]
    ) -> dict[QuotaEntity, dict[QuotaKey, float]]:
        """The effective quotas: the file's, with API values on top and API removals taken out."""
        effective = {entity: dict(values) for entity, values in file_quotas.items()}
        for entity, values in self.values.items():
            effective.setdefault(entity, {}).update(values)
        for entity, keys in self.removed.items():
            current = effective.get(entity)
            if current is not None:
                for key in keys:
                    current.pop(key, None)
        return {entity: values for entity, values in effective.items() if values}


def _discard_value(values: dict[QuotaEntity, dict[QuotaKey, float]], entity: QuotaEntity,
                   key: QuotaKey) -> None:
    current = values.get(entity)
    if current is not None:
        current.pop(key, None)
        if not current:
            del values[entity]


# ---- saving ----


def save_state(path: str | os.PathLike[str], layer: ApiQuotaLayer) -> None:
    """Write `layer` to `path` atomically; raise ConfigError if it cannot be written.

    On failure the previous file is left as it was and the temp file is removed.
    """
    target = Path(path)
    text = json.dumps(_encode(layer), indent=2, sort_keys=True, allow_nan=False) + "\n"
    try:
        write_atomically(target, text, mode=0o600)  # who set which quota: for the operator only
    except OSError as e:
        raise ConfigError(STATE_KEY, f"cannot write the quota state: {_reason(e)}", str(target)) from e


def _encode(layer: ApiQuotaLayer) -> dict[str, Any]:
    entries = []
    for entity in sorted(set(layer.values) | set(layer.removed), key=_entity_order):
        values = layer.values.get(entity, {})
        removed = layer.removed.get(entity, set())
        if not values and not removed:
            continue
        entries.append({
            "entity": {name: getattr(entity, attr) for name, attr in _ENTITY_FIELDS
                       if getattr(entity, attr) is not None},
            "values": {key.value: float(value) for key, value in values.items()},
            "removed": sorted(key.value for key in removed),
        })
    return {"version": STATE_VERSION, "entities": entries}


def _entity_order(entity: QuotaEntity) -> tuple[tuple[bool, str], ...]:
    return tuple((name is not None, name or "") for name in entity.names())


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


# ---- loading ----


def load_state(path: str | os.PathLike[str]) -> ApiQuotaLayer:
    """Read the state file; a missing file is an empty layer (nothing set through the API yet).

    A file that cannot be read or is not a valid state raises ConfigError naming the file.
    """
    target = Path(path)
    document = load_document(target, STATE_KEY, what="quota state", as_json=True, missing_ok=True)
    if document is MISSING:
        return ApiQuotaLayer()
    try:
        return _decode(document)
    except _Invalid as e:
        raise ConfigError(STATE_KEY, f"the quota state is corrupt: {e}", str(target)) from e


class _Invalid(Exception):
    pass


def _decode(document: Any) -> ApiQuotaLayer:
    if not isinstance(document, dict):
        raise _Invalid("expected a JSON object at the top")
    if document.get("version") != STATE_VERSION:
        raise _Invalid(f"unsupported version {document.get('version')!r}, expected {STATE_VERSION}")
    entries = document.get("entities")
    if not isinstance(entries, list):
        raise _Invalid("'entities' must be a list")
    layer = ApiQuotaLayer()
    seen: set[QuotaEntity] = set()
    for index, item in enumerate(entries):
        where = f"entities[{index}]"
        if not isinstance(item, dict):
            raise _Invalid(f"{where} must be an object")
        entity = _decode_entity(item.get("entity"), where)
        if entity in seen:
            raise _Invalid(f"{where}: entity {entity.describe()} appears twice")
        seen.add(entity)
        values = _decode_values(item.get("values", {}), where)
        removed = _decode_removed(item.get("removed", []), where)
        both = set(values) & removed
        if both:
            names = ", ".join(sorted(key.value for key in both))
            raise _Invalid(f"{where}: {names} both set and removed")
        if values:
            layer.values[entity] = values
        if removed:
            layer.removed[entity] = removed
    return layer


def _decode_entity(raw: Any, where: str) -> QuotaEntity:
    if not isinstance(raw, dict):
        raise _Invalid(f"{where}.entity must be an object")
    known = {name for name, _ in _ENTITY_FIELDS}
    unknown = set(raw) - known
    if unknown:
        raise _Invalid(f"{where}.entity has unknown entity types {sorted(unknown)}")
    fields: dict[str, str] = {}
    for name, attr in _ENTITY_FIELDS:
        if name in raw:
            value = raw[name]
            if not isinstance(value, str) or not value:
                raise _Invalid(f"{where}.entity.{name} must be a non-empty string")
            fields[attr] = value
    try:
        return QuotaEntity(**fields)
    except ValueError as e:
        raise _Invalid(f"{where}.entity: {e}") from e


def _decode_values(raw: Any, where: str) -> dict[QuotaKey, float]:
    if not isinstance(raw, dict):
        raise _Invalid(f"{where}.values must be an object")
    values: dict[QuotaKey, float] = {}
    for name, value in raw.items():
        key = _decode_key(name, f"{where}.values")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or value <= 0:
            raise _Invalid(f"{where}.values.{name} must be a positive number, got {value!r}")
        values[key] = float(value)
    return values


def _decode_removed(raw: Any, where: str) -> set[QuotaKey]:
    if not isinstance(raw, list):
        raise _Invalid(f"{where}.removed must be a list")
    return {_decode_key(name, f"{where}.removed") for name in raw}


def _decode_key(name: Any, where: str) -> QuotaKey:
    key = key_named(name)
    if key is None:
        raise _Invalid(f"{where}: unknown quota key {name!r}")
    return key


# ---- the same layer in a shared store: one field per (entity, key) ----


def change_field(entity: QuotaEntity, key: QuotaKey, value: float | None) -> tuple[str, str]:
    """One API change as a store field and value: the field names the entity and the key (JSON,
    so any name is safe), the value is the number, or "" for a removal (a tombstone)."""
    names = {name: getattr(entity, attr) for name, attr in _ENTITY_FIELDS
             if getattr(entity, attr) is not None}
    field_text = json.dumps([names, key.value], sort_keys=True, separators=(",", ":"))
    return field_text, "" if value is None else repr(float(value))


def layer_fields(layer: ApiQuotaLayer) -> list[tuple[str, str]]:
    """Every value and tombstone of `layer` as store fields."""
    out = [change_field(e, k, v) for e, values in layer.values.items() for k, v in values.items()]
    out += [change_field(e, k, None) for e, keys in layer.removed.items() for k in keys]
    return out


def layer_from_fields(fields: Mapping[str, str]) -> tuple[ApiQuotaLayer, list[str]]:
    """The layer a store's fields describe, and the fields that were not understood (skipped:
    a newer replica's key, or damage; the caller logs them)."""
    layer = ApiQuotaLayer()
    skipped: list[str] = []
    for field_text, value_text in sorted(fields.items()):
        try:
            raw_entity, raw_key = json.loads(field_text)
            entity = _decode_entity(raw_entity, "field")
            key = _decode_key(raw_key, "field")
            if value_text == "":
                layer.apply(entity, key, None)
                continue
            value = float(value_text)
            if not math.isfinite(value) or value <= 0:
                raise _Invalid(f"value {value_text!r}")
            layer.apply(entity, key, value)
        except (ValueError, TypeError, _Invalid):
            skipped.append(field_text)
    return layer, skipped
