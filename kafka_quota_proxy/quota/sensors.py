"""Where measurements live: a key (("Produce", user tag, client-id tag), ("ip", address), ...)
mapped to a `Rate` or `TokenBucket`, expiring like Kafka's sensors and capped in number. A Rate
paced by the proxy holds its `Pacer` beside it, as a Kafka Sensor holds several stats
(`SensorHandle.pacer`).

The managers only talk to the `Sensors` protocol, so the store can later be shared between proxy
replicas; `LocalSensors` is the in-process one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Protocol, TypeVar

from kafka_quota_proxy.quota.pacer import Pacer
from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.token_bucket import TokenBucket

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

    def found(self, key: Hashable, now_ms: float) -> SensorHandle | None:
        """`get`, as the entry's handle (its stat and what is kept beside it)."""
        ...

    def handle(self, key: Hashable, now_ms: float, factory: Callable[[], S]) -> SensorHandle | None:
        """`get_or_create`, as a handle a caller may keep and `touch` instead of looking the key
        up again."""
        ...

    def touch(self, handle: SensorHandle, now_ms: float) -> bool:
        """Use a kept handle as `get_or_create` would use its key: touched at `now_ms`. False
        if its entry has expired or been removed meanwhile; then call `handle` again."""
        ...

    def remove(self, key: Hashable) -> None: ...

    def expire(self, now_ms: float) -> int:
        """Drop entries idle for longer than the expiry; returns how many."""
        ...

    def entries(self, now_ms: float) -> list[tuple[Hashable, object]]:
        """The live (key, stat) pairs, for metrics."""
        ...

    def __len__(self) -> int: ...


class StatFactory(Protocol):
    """Makes the stat a sensor key is measured on: Kafka's own (`LocalStats`), or one shared with
    other replicas (`quota.shared.ScopedShared`)."""

    def rate(self, key: Hashable) -> Rate: ...

    def bucket(self, key: Hashable, rate_per_s: float) -> TokenBucket: ...

    def pacer(self, rate: Rate) -> Pacer:
        """The pacer of a rate this factory made, for the proxy's pacing of its bytes."""
        ...


class LocalStats:
    """`StatFactory` of this process alone."""

    __slots__ = ("config",)

    def __init__(self, config: MetricConfig) -> None:
        self.config = config

    def rate(self, key: Hashable) -> Rate:
        return Rate(self.config)

    def bucket(self, key: Hashable, rate_per_s: float) -> TokenBucket:
        return TokenBucket(rate_per_s, self.config)

    def pacer(self, rate: Rate) -> Pacer:
        return Pacer(rate.config)


class SensorHandle:
    """One entry of a sensor store, kept by a caller that records into it again and again (a
    client connection): `touch` it instead of looking its key up. `live` turns False when the
    store drops the entry. `pacer`: the proxy's pacing of the stat's bytes, beside Kafka's stat,
    made by a quota manager the first time it paces them (None until then)."""

    __slots__ = ("key", "stat", "last_ms", "live", "pacer")

    def __init__(self, key: Hashable, stat: object, last_ms: float) -> None:
        self.key = key
        self.stat = stat
        self.last_ms = last_ms
        self.live = True
        self.pacer: Pacer | None = None


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
        self._entries: OrderedDict[Hashable, SensorHandle] = OrderedDict()
        self._dropped = 0

    @property
    def dropped(self) -> int:
        return self._dropped

    def get_or_create(self, key: Hashable, now_ms: float, factory: Callable[[], S]) -> S | None:
        entry = self.handle(key, now_ms, factory)
        return None if entry is None else entry.stat  # type: ignore[return-value]  # a key's factory never changes

    def handle(self, key: Hashable, now_ms: float, factory: Callable[[], S]) -> SensorHandle | None:
        entries = self._entries
        entry = entries.get(key)
        if entry is not None:
            if self.touch(entry, now_ms):
                return entry
            self._drop(key)  # expired: a new sensor, counters from zero
        if len(entries) >= self.max_entities:
            self.expire(now_ms)
            if len(entries) >= self.max_entities:
                self._dropped += 1
                return None
        entry = entries[key] = SensorHandle(key, factory(), now_ms)
        return entry

    def touch(self, handle: SensorHandle, now_ms: float) -> bool:
        if not handle.live or now_ms - handle.last_ms > self.expiry_ms:
            return False
        if now_ms > handle.last_ms:
            handle.last_ms = now_ms
        self._entries.move_to_end(handle.key)  # kept in order of last use, for `expire`
        return True

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.live = False

    def rate(self, key: Hashable, now_ms: float) -> Rate | None:
        """`get_or_create` with a `Rate` of this store's config."""
        return self.get_or_create(key, now_ms, lambda: Rate(self.config))

    def get(self, key: Hashable, now_ms: float) -> object | None:
        entry = self.found(key, now_ms)
        return None if entry is None else entry.stat

    def found(self, key: Hashable, now_ms: float) -> SensorHandle | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now_ms - entry.last_ms > self.expiry_ms:
            self._drop(key)
            return None
        return entry

    def remove(self, key: Hashable) -> None:
        self._drop(key)

    def expire(self, now_ms: float) -> int:
        entries = self._entries
        limit = self.expiry_ms
        removed = 0
        while entries:
            key, entry = next(iter(entries.items()))
            if now_ms - entry.last_ms <= limit:
                break
            self._drop(key)
            removed += 1
        return removed

    def entries(self, now_ms: float) -> list[tuple[Hashable, object]]:
        self.expire(now_ms)
        return [(key, entry.stat) for key, entry in self._entries.items()]

    def __len__(self) -> int:
        return len(self._entries)
