"""Which configured quota applies to a (user, client-id), and which shared sensor it is measured on.

This is Kafka's DefaultQuotaCallback (ClientQuotaManager.scala 537-652): the eight-level
precedence, the metric tags that pick the shared sensor, and the quota-types-enabled flags.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntFlag

from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import sensor_name

# Characters java.net.URLEncoder leaves alone; '*' is then replaced by Kafka's Sanitizer.
_URL_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")
_PLAIN = re.compile(r"[A-Za-z0-9._\-]*\Z")


def sanitize_user(name: str) -> str:
    """Kafka's `Sanitizer.sanitize`: URL-encode the UTF-8 bytes (java.net.URLEncoder), then write a
    space as `%20` rather than `+` and `*` as `%2A`. Unlike Python's quote(), `~` is encoded."""
    if _PLAIN.match(name):
        return name
    out = []
    # Lone surrogates become '?' as Java's encoder does with malformed input.
    for b in name.encode("utf-8", errors="replace"):
        if b in _URL_SAFE:
            out.append(chr(b))
        else:
            out.append(f"%{b:02X}")
    return "".join(out)


class QuotaTypes(IntFlag):
    """Kafka's `quotaTypesEnabled` bits: which kinds of entity have ever had a quota of one key."""

    NO_QUOTAS = 0
    CLIENT_ID = 1
    USER = 2
    USER_CLIENT_ID = 4


def _entity_type(entity: QuotaEntity) -> QuotaTypes:
    if entity.user is not None:
        return QuotaTypes.USER_CLIENT_ID if entity.client_id is not None else QuotaTypes.USER
    if entity.client_id is not None:
        return QuotaTypes.CLIENT_ID
    return QuotaTypes.NO_QUOTAS  # ip and topic entities: their quotas do not use these flags


class QuotaStore:
    """The configured quotas: QuotaEntity -> {QuotaKey: value}. Entity names are as configured
    (raw user principal names, raw client-ids, `<default>`); resolvers sanitize them.

    `version` grows on every change so readers can cache what they derive. The store also keeps
    Kafka's quota-types-enabled flags per key, because only the store sees every change: a quota
    set and removed between two lookups must still leave its flag on.
    """

    __slots__ = ("_quotas", "_enabled", "_topics_enabled", "version")

    def __init__(self, mapping: Mapping[QuotaEntity, Mapping[QuotaKey, float]] | None = None) -> None:
        self._quotas: dict[QuotaEntity, dict[QuotaKey, float]] = {}
        self._enabled: dict[QuotaKey, QuotaTypes] = {}
        self._topics_enabled: set[QuotaKey] = set()
        self.version = 0
        if mapping:
            self.replace(mapping)

    def _enable(self, entity: QuotaEntity, key: QuotaKey) -> None:
        if entity.topic is not None:
            self._topics_enabled.add(key)
            return
        self._enabled[key] = self._enabled.get(key, QuotaTypes.NO_QUOTAS) | _entity_type(entity)

    def set(self, entity: QuotaEntity, key: QuotaKey, value: float) -> None:
        values = self._quotas.setdefault(entity, {})
        self._enable(entity, key)
        if values.get(key) != value:
            values[key] = float(value)
            self.version += 1

    def remove(self, entity: QuotaEntity, key: QuotaKey) -> None:
        """Remove one quota; removing an absent one is a no-op, as in AlterClientQuotas."""
        values = self._quotas.get(entity)
        if values is None or key not in values:
            return
        del values[key]
        if not values:
            del self._quotas[entity]
        self.version += 1

    def get(self, entity: QuotaEntity) -> dict[QuotaKey, float]:
        return dict(self._quotas.get(entity, {}))

    def entries(self) -> dict[QuotaEntity, dict[QuotaKey, float]]:
        return {entity: dict(values) for entity, values in self._quotas.items()}

    def items_for(self, key: QuotaKey) -> list[tuple[QuotaEntity, float]]:
        """Every entity with a quota for `key`, and its value."""
        return [(entity, values[key]) for entity, values in self._quotas.items() if key in values]

    def replace(self, mapping: Mapping[QuotaEntity, Mapping[QuotaKey, float]]) -> None:
        """Swap in a whole new set of quotas (a reloaded config file, a restored state file)."""
        quotas: dict[QuotaEntity, dict[QuotaKey, float]] = {}
        for entity, values in mapping.items():
            if values:
                quotas[entity] = {QuotaKey(k): float(v) for k, v in values.items()}
                for k in quotas[entity]:
                    self._enable(entity, k)
        self._quotas = quotas
        self.version += 1

    def snapshot(self) -> QuotaStore:
        """An independent copy, sticky flags included: resolves exactly as this store does now."""
        copy = QuotaStore()
        copy._quotas = {entity: dict(values) for entity, values in self._quotas.items()}
        copy._enabled = dict(self._enabled)
        copy._topics_enabled = set(self._topics_enabled)
        copy.version = self.version
        return copy

    def quota_types_enabled(self, key: QuotaKey) -> QuotaTypes:
        """The sticky flags for `key`: set when a quota of that entity kind is first configured and
        never cleared (Kafka keeps them until the broker restarts; here, for this store's life)."""
        return self._enabled.get(key, QuotaTypes.NO_QUOTAS)

    def topic_quotas_enabled(self, key: QuotaKey) -> bool:
        """Sticky as quota_types_enabled: a topic quota of `key` has been configured at some time,
        so Produce requests (producer_byte_rate) or Fetch responses (consumer_byte_rate) are
        measured per topic from then on."""
        return key in self._topics_enabled


Tags = tuple[str, str]  # (user tag, client-id tag); "" means the tag is not part of the sensor


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a (user, client-id) resolves to for one quota key: the shared-sensor tags, the quota
    (None = unlimited), and a sensor key (quota type, user tag, client-id tag) for `Sensors`."""

    tags: Tags
    quota: float | None
    sensor_key: tuple[str, str, str]


class QuotaResolver:
    """Section 4 of the reference for one quota key, over a `QuotaStore`.

    `tags()` picks the shared sensor from the quota-types-enabled flags (sticky: set once a quota
    of that kind has ever been configured, never cleared), and `quota()` looks the limit up from
    the tags alone, so `(u, "")` is shared by all clients of a user and `("", "")` is unlimited
    even when a `<default>` exists. Results are cached per (user, client-id) until the store's
    version changes.
    """

    __slots__ = ("store", "key", "_type_name", "_version", "_types", "_index", "_cache", "_cached",
                 "max_cached")

    def __init__(self, store: QuotaStore, key: QuotaKey, max_cached: int = 100_000) -> None:
        self.store = store
        self.key = key
        self._type_name = sensor_name(key)
        self.max_cached = max_cached
        self._version = -1
        self._types = QuotaTypes.NO_QUOTAS
        # (sanitized user | DEFAULT | None, client-id | DEFAULT | None) -> value, for this key only.
        self._index: dict[tuple[str | None, str | None], float] = {}
        # user -> client-id -> Resolution; nested so a lookup allocates no tuple.
        self._cache: dict[str, dict[str, Resolution]] = {}
        self._cached = 0

    def _refresh(self) -> None:
        store = self.store
        if store.version == self._version:
            return
        index: dict[tuple[str | None, str | None], float] = {}
        key = self.key
        for entity, value in store.items_for(key):
            if entity.ip is not None or entity.topic is not None:
                continue
            user = entity.user
            if user is not None and user != DEFAULT:
                user = sanitize_user(user)
            index[(user, entity.client_id)] = value
        self._index = index
        self._types = store.quota_types_enabled(key)
        self._cache = {}
        self._cached = 0
        self._version = store.version

    @property
    def quota_types_enabled(self) -> QuotaTypes:
        self._refresh()
        return self._types

    @property
    def quotas_enabled(self) -> bool:
        """False until a quota of this key has ever been configured: then nothing is recorded."""
        self._refresh()
        return self._types != QuotaTypes.NO_QUOTAS

    def tags(self, user: str, client_id: str | None) -> Tags:
        """The shared-sensor tags for a raw principal name and a raw client-id (None -> "")."""
        return self.resolve(user, client_id).tags

    def _tags(self, user_tag: str, client_id: str) -> Tags:
        types = self._types
        if types == QuotaTypes.NO_QUOTAS or types == QuotaTypes.CLIENT_ID:
            return ("", client_id)
        if types == QuotaTypes.USER:
            return (user_tag, "")
        if types == QuotaTypes.USER_CLIENT_ID:
            return (user_tag, client_id)
        # Mixed: walk levels 1-6 on the existence of a config (not on its value).
        index = self._index
        if ((user_tag, client_id) in index or (user_tag, DEFAULT) in index):
            return (user_tag, client_id)  # 1, 2
        if (user_tag, None) in index:
            return (user_tag, "")  # 3
        if (DEFAULT, client_id) in index or (DEFAULT, DEFAULT) in index:
            return (user_tag, client_id)  # 4, 5
        if (DEFAULT, None) in index:
            return (user_tag, "")  # 6
        return ("", client_id)  # 7, 8 or nothing

    def quota(self, tags: Tags) -> float | None:
        """The quota for a sensor's tags (None = unlimited, Kafka's Long.MAX_VALUE bound)."""
        self._refresh()
        user_tag, client_id = tags
        get = self._index.get
        if user_tag and client_id:
            for k in ((user_tag, client_id), (user_tag, DEFAULT), (DEFAULT, client_id), (DEFAULT, DEFAULT)):
                value = get(k)
                if value is not None:
                    return value
            return None
        if user_tag:
            value = get((user_tag, None))
            return value if value is not None else get((DEFAULT, None))
        if client_id:
            value = get((None, client_id))
            return value if value is not None else get((None, DEFAULT))
        return None  # ("", ""): no quota, even with a <default>

    def resolve_if_enabled(self, user: str, client_id: str | None) -> Resolution | None:
        """`resolve`, or None while no quota of this key has ever been configured: the check and
        the lookup every charged request makes, with one refresh between them."""
        self._refresh()
        if self._types == QuotaTypes.NO_QUOTAS:
            return None
        return self._resolve(user, client_id)

    def resolve(self, user: str, client_id: str | None) -> Resolution:
        """Tags, quota and sensor key for a raw principal name and raw client-id, cached."""
        self._refresh()
        return self._resolve(user, client_id)

    def _resolve(self, user: str, client_id: str | None) -> Resolution:
        if client_id is None:
            client_id = ""
        by_client = self._cache.get(user)
        if by_client is not None:
            hit = by_client.get(client_id)
            if hit is not None:
                return hit
        tags = self._tags(sanitize_user(user), client_id)
        res = Resolution(tags, self.quota(tags), (self._type_name, tags[0], tags[1]))
        if self._cached >= self.max_cached:
            # Unbounded distinct client-ids must not grow this forever; recomputing is cheap.
            self._cache = {}
            self._cached = 0
            by_client = None
        if by_client is None:
            by_client = self._cache.setdefault(user, {})
        by_client[client_id] = res
        self._cached += 1
        return res
