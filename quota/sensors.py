"""Where measurements live: a key (("Produce", user tag, client-id tag), ("ip", address), ...)
mapped to a `Rate` or `TokenBucket`, expiring like Kafka's sensors and capped in number.

The managers only talk to the `Sensors` protocol, so the store can later be shared between proxy
replicas; `LocalSensors` is the in-process one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Protocol, TypeVar

from .rate import MetricConfig, Rate

S = TypeVar("S")

INACTIVE_SENSOR_EXPIRATION_MS = 3_600_000  # ClientQuotaManager.InactiveSensorExpirationTimeSeconds


class Sensors(Protocol):
    """The measurement store the quota managers record into."""

    @property
    def dropped(self) -> int:
        """How many creations were refused because the store was full."""
        ...

    def get_or_create(self, key: Hashable, now_ms: float, factory: Callable[[], S]) -> S | None:
        """The live stat for `key`, touched at `now_ms` (about to be recorded), or a new one from
        `factory`; None if it would exceed the entity cap."""
        ...

    def get(self, key: Hashable, now_ms: float) -> object | None:
        """The live stat for `key` without touching it (for metrics), or None."""
        ...

    def remove(self, key: Hashable) -> None: ...

    def expire(self, now_ms: float) -> int:
        """Drop entries idle for longer than the expiry; returns how many."""
        ...

    def entries(self, now_ms: float) -> list[tuple[Hashable, object]]:
        """The live (key, stat) pairs, for metrics."""
        ...

    def __len__(self) -> int: ...


class _Entry:
    __slots__ = ("stat", "last_ms")

    def __init__(self, stat: object, last_ms: float) -> None:
        self.stat = stat
        self.last_ms = last_ms


class LocalSensors:
    """In-process `Sensors`: an entry idle for more than `expiry_ms` (Kafka: 1 h since its last
    record) is dropped, so its counters start again from zero; at most `max_entities` entries
    exist, and a creation beyond that is refused and counted in `dropped`.

    `config` is the sample layout of the Rates made by `rate()`. Entries are kept in order of last
    use, so expiring costs only the entries that expire (time is assumed to move forward).
    """

    __slots__ = ("config", "max_entities", "expiry_ms", "_entries", "_dropped")

    def __init__(self, config: MetricConfig, max_entities: int = 100_000,
                 expiry_ms: int = INACTIVE_SENSOR_EXPIRATION_MS) -> None:
        if max_entities < 0:
            raise ValueError(f"max_entities must be >= 0, got {max_entities}")
        if expiry_ms < 0:
            raise ValueError(f"expiry_ms must be >= 0, got {expiry_ms}")
        self.config = config
        self.max_entities = max_entities
        self.expiry_ms = expiry_ms
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._dropped = 0

    @property
    def dropped(self) -> int:
        return self._dropped

    def get_or_create(self, key: Hashable, now_ms: float, factory: Callable[[], S]) -> S | None:
        entries = self._entries
        entry = entries.get(key)
        if entry is not None:
            if now_ms - entry.last_ms <= self.expiry_ms:
                if now_ms > entry.last_ms:
                    entry.last_ms = now_ms
                entries.move_to_end(key)
                return entry.stat  # type: ignore[return-value]  # the factory for a key never changes
            del entries[key]  # expired: a new sensor, counters from zero
        if len(entries) >= self.max_entities:
            self.expire(now_ms)
            if len(entries) >= self.max_entities:
                self._dropped += 1
                return None
        stat = factory()
        entries[key] = _Entry(stat, now_ms)
        return stat

    def rate(self, key: Hashable, now_ms: float) -> Rate | None:
        """`get_or_create` with a `Rate` of this store's config."""
        return self.get_or_create(key, now_ms, lambda: Rate(self.config))

    def get(self, key: Hashable, now_ms: float) -> object | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now_ms - entry.last_ms > self.expiry_ms:
            del self._entries[key]
            return None
        return entry.stat

    def remove(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def expire(self, now_ms: float) -> int:
        entries = self._entries
        limit = self.expiry_ms
        removed = 0
        while entries:
            key, entry = next(iter(entries.items()))
            if now_ms - entry.last_ms <= limit:
                break
            del entries[key]
            removed += 1
        return removed

    def entries(self, now_ms: float) -> list[tuple[Hashable, object]]:
        self.expire(now_ms)
        return [(key, entry.stat) for key, entry in self._entries.items()]

    def __len__(self) -> int:
        return len(self._entries)
