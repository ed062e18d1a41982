"""The seen-producer-id cache of KIP-936: per user, Bloom filters of producer ids rotated with time.

A filter takes new ids for one window W; the next addition opens a second; a filter is dropped
at 1.5 W, so a user has at most two live ones and leaves the cache with none. Errors only let a
new id through uncounted. Time is passed in as `now_ms`. The design: docs/producer-id-quotas.md.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

import mmh3

from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.managers import ClientQuotaManager
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.resolution import QuotaStore, sanitize_user
from kafka_quota_proxy.quota.sensors import Sensors, StatFactory
from kafka_quota_proxy.quota.shared import SharedIds

# KIP-936's proposed broker configs and defaults.
PRODUCER_ID_QUOTA_WINDOW_NUM = 11  # producer.id.quota.window.num: samples in the new-id Rate
PRODUCER_ID_QUOTA_WINDOW_SIZE_SECONDS = 3600  # producer.id.quota.window.size.seconds: W
PRODUCER_ID_QUOTA_CACHE_CLEANUP_INTERVAL_MS = 10  # producer.id.quota.cache.cleanup.scheduler.interval.ms

# This module's defaults (not from the KIP, which leaves the filter's shape open). Every filter has
# the same shape, so the worst case is max_users * 2 filters: with these, 10,000 * 2 * 1,199 bytes
# (24 MB) of bits.
DEFAULT_WINDOW_MS = PRODUCER_ID_QUOTA_WINDOW_SIZE_SECONDS * 1000
DEFAULT_EXPECTED_PER_WINDOW = 1000
DEFAULT_FP_RATE = 0.01
DEFAULT_MAX_USERS = 10_000
DEFAULT_MAX_BITS_PER_USER = 1 << 17  # 16 KiB a filter; holds about 13,600 ids at 1%

_LN2 = math.log(2)


def _hash(pid: int, seed: int) -> tuple[int, int]:
    # One 128-bit MurmurHash3 gives both halves for double hashing (Kirsch-Mitzenmacher), so the
    # k positions cost one hash call. Signed halves are fine: Python's % is never negative.
    return mmh3.hash64(pid.to_bytes(8, "big", signed=True), seed)


class BloomFilter:
    """A fixed-size Bloom filter of producer ids (signed 64-bit integers).

    Sized for `expected` ids at false-positive rate `fp_rate`: m = ceil(-n ln p / (ln 2)^2) bits
    and k = round(m / n * ln 2) (at least 1) positions per id. `max_bits` caps m; k is then
    recomputed for the smaller m (the best k for n ids in m bits), and `capacity`, the number of
    ids it holds at `fp_rate`, falls below `expected`. `seed` picks the hash family: a secret one
    stops a client from crafting ids whose bits are already set.
    """

    __slots__ = ("expected", "fp_rate", "num_bits", "num_hashes", "capacity", "seed", "count",
                 "bits_set", "_bits")

    def __init__(self, expected: int, fp_rate: float, max_bits: int | None = None, seed: int = 0) -> None:
        if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
            raise ValueError(f"expected must be a whole number >= 1, got {expected!r}")
        if not 0.0 < fp_rate < 1.0:
            raise ValueError(f"fp_rate must be between 0 and 1 (exclusive), got {fp_rate!r}")
        if max_bits is not None and max_bits < 1:
            raise ValueError(f"max_bits must be >= 1, got {max_bits!r}")
        self.expected = expected
        self.fp_rate = fp_rate
        self.seed = seed
        m = math.ceil(-expected * math.log(fp_rate) / (_LN2 * _LN2))
        capped = max_bits is not None and m > max_bits
        if max_bits is not None and capped:
            m = max_bits
        self.num_bits = m
        # Half-up, as the formula reads; Python's round() would round 2.5 down to 2.
        k = max(1, math.floor(m / expected * _LN2 + 0.5))
        self.num_hashes = k
        if capped:
            # The n at which (1 - e^(-kn/m))^k reaches p, for this m and k.
            self.capacity = min(expected, math.floor(-m / k * math.log1p(-fp_rate ** (1.0 / k))))
        else:
            self.capacity = expected
        self.count = 0  # add() calls
        self.bits_set = 0  # kept on add, so the fill ratio costs nothing to read
        self._bits = bytearray((m + 7) // 8)

    @property
    def size_bytes(self) -> int:
        """The bit array's size: ceil(m / 8)."""
        return len(self._bits)

    def add(self, pid: int) -> None:
        """Set `pid`'s k bits. Adding an id twice counts twice in `count`."""
        h1, h2 = _hash(pid, self.seed)
        self._add_hashed(h1, h2)

    def __contains__(self, pid: object) -> bool:
        if not isinstance(pid, int):
            return False
        h1, h2 = _hash(pid, self.seed)
        return self._contains_hashed(h1, h2)

    def _add_hashed(self, h1: int, h2: int) -> None:
        bits = self._bits
        m = self.num_bits
        newly_set = 0
        h = h1
        for _ in range(self.num_hashes):
            pos = h % m
            i = pos >> 3
            mask = 1 << (pos & 7)
            b = bits[i]
            if not b & mask:
                bits[i] = b | mask
                newly_set += 1
            h += h2
        self.bits_set += newly_set
        self.count += 1

    def _contains_hashed(self, h1: int, h2: int) -> bool:
        bits = self._bits
        m = self.num_bits
        h = h1
        for _ in range(self.num_hashes):
            pos = h % m
            if not bits[pos >> 3] & (1 << (pos & 7)):
                return False
            h += h2
        return True

    def estimated_fp_rate(self) -> float:
        """The chance that an id never added looks present now: (bits set / m) ** k."""
        return (self.bits_set / self.num_bits) ** self.num_hashes

    def __repr__(self) -> str:
        return (f"BloomFilter(expected={self.expected}, fp_rate={self.fp_rate}, num_bits={self.num_bits}, "
                f"num_hashes={self.num_hashes}, count={self.count}, bits_set={self.bits_set})")


@dataclass(slots=True)
class _Window:
    """One of a user's filters and the time it was opened."""

    start_ms: float
    bloom: BloomFilter


class ProducerIdCache:
    """Per user, which producer ids were seen lately: KIP-936's two rotating Bloom filters.

    `track` answers whether an id is new for its user and remembers it. An id is remembered until
    the filter it went into is 1.5 windows old: between 0.5 and 1.5 windows after it was added. A
    seen id is not added again, so a producer that stays active counts as new again every 1 to 1.5
    windows: the quota counts the ids active in a window, not the ids ever seen.

    A filter opens at the addition that needs it, not on a wall-clock boundary, as Kafka's samples
    start at the event that opens them; so each filter takes additions for a full window.

    Memory is bounded: at most `max_users` users, each with at most two filters of the same
    shape, each at most `max_bits_per_user` bits (so a user holds at most twice that). A new user
    beyond the cap is not tracked: its ids are answered "not new", since a quota must never
    throttle on what it could not count, and each refusal counts in `dropped_users`. An addition
    to a filter already at its capacity still happens (the false-positive rate then rises above
    `fp_rate`) and counts in `overfull_adds`.

    `expire` drops filters 1.5 windows old and users left without one; it costs only what
    expires (KIP-936 runs it every 10 ms; the caller decides). `track` also drops a user's dead
    filters before looking, so answers do not wait for `expire`. `seed` is passed to the filters.
    """

    __slots__ = ("window_ms", "expected_per_window", "fp_rate", "max_users", "max_bits_per_user", "seed",
                 "dropped_users", "overfull_adds", "_drop_after_ms", "_users", "_due", "_seq")

    def __init__(self, window_ms: int = DEFAULT_WINDOW_MS,
                 expected_per_window: int = DEFAULT_EXPECTED_PER_WINDOW,
                 fp_rate: float = DEFAULT_FP_RATE, max_users: int = DEFAULT_MAX_USERS,
                 max_bits_per_user: int = DEFAULT_MAX_BITS_PER_USER, seed: int = 0) -> None:
        if isinstance(window_ms, bool) or not isinstance(window_ms, int) or window_ms < 1:
            raise ValueError(f"window_ms must be a whole number >= 1, got {window_ms!r}")
        if max_users < 0:
            raise ValueError(f"max_users must be >= 0, got {max_users!r}")
        # Validates expected_per_window, fp_rate and max_bits_per_user the same way every filter will.
        BloomFilter(expected_per_window, fp_rate, max_bits_per_user, seed)
        self.window_ms = window_ms
        self.expected_per_window = expected_per_window
        self.fp_rate = fp_rate
        self.max_users = max_users
        self.max_bits_per_user = max_bits_per_user
        self.seed = seed
        self.dropped_users = 0
        self.overfull_adds = 0
        self._drop_after_ms = 1.5 * window_ms  # exact in binary floating point for any int
        # Oldest filter first; at most two.
        self._users: dict[str, list[_Window]] = {}
        # (start_ms, seq, user) for every filter opened: a heap in drop order, so `expire` visits
        # only the users with a filter to drop. seq breaks ties without comparing users.
        self._due: list[tuple[float, int, str]] = []
        self._seq = 0

    def track(self, user: str, pid: int, now_ms: float) -> bool:
        """True if `pid` is new for `user` (in none of its live filters); it is then added.

        False for a seen id, for pid < 0 (-1 is "no producer id": not idempotent), and for a new
        user the cache has no room for.
        """
        if pid < 0:
            return False
        windows = self._users.get(user)
        if windows is None:
            if len(self._users) >= self.max_users:
                self.expire(now_ms)
                if len(self._users) >= self.max_users:
                    self.dropped_users += 1
                    return False
            windows = []
            self._users[user] = windows
        else:
            self._drop_dead(windows, now_ms)
        # Every filter has the same shape and seed, so one hash serves them all.
        h1, h2 = _hash(pid, self.seed)
        for window in windows:
            if window.bloom._contains_hashed(h1, h2):
                return False
        if not windows or now_ms - windows[-1].start_ms >= self.window_ms:
            # The newest filter is a window old (or there is none). Any older one has already been
            # dropped: it opened at least a window before the newest, so it is 2 windows old.
            windows.append(self._open(user, now_ms))
        bloom = windows[-1].bloom
        if bloom.count >= bloom.capacity:
            self.overfull_adds += 1
        bloom._add_hashed(h1, h2)
        return True

    def seen(self, user: str, pid: int, now_ms: float) -> bool:
        """Whether `track` would answer "not new", without adding anything: pid < 0, or in one
        of the user's live filters. A user the cache has no room for is not "seen"."""
        if pid < 0:
            return True
        windows = self._users.get(user)
        if not windows:
            return False
        h1, h2 = _hash(pid, self.seed)
        drop_after = self._drop_after_ms
        return any(now_ms - w.start_ms < drop_after and w.bloom._contains_hashed(h1, h2) for w in windows)

    def has_room_for(self, user: str) -> bool:
        """Whether `user` is tracked or could be (the cap on users not reached)."""
        return user in self._users or len(self._users) < self.max_users

    def _open(self, user: str, now_ms: float) -> _Window:
        window = _Window(now_ms, BloomFilter(self.expected_per_window, self.fp_rate,
                                             self.max_bits_per_user, self.seed))
        self._seq += 1
        heapq.heappush(self._due, (now_ms, self._seq, user))
        return window

    def _drop_dead(self, windows: list[_Window], now_ms: float) -> None:
        while windows and now_ms - windows[0].start_ms >= self._drop_after_ms:
            del windows[0]

    def expire(self, now_ms: float) -> int:
        """Drop the filters 1.5 windows old; returns how many users were left without one and removed."""
        due = self._due
        drop_after = self._drop_after_ms
        removed = 0
        while due and now_ms - due[0][0] >= drop_after:
            _, _, user = heapq.heappop(due)
            windows = self._users.get(user)
            if windows is None:
                continue  # the user already left; this was one of its other filters
            # The filter may be gone already (track dropped it), and the user may hold newer ones.
            self._drop_dead(windows, now_ms)
            if not windows:
                del self._users[user]
                removed += 1
        return removed

    def _live(self, user: str, now_ms: float) -> list[_Window]:
        windows = self._users.get(user, [])
        return [w for w in windows if now_ms - w.start_ms < self._drop_after_ms]

    def users(self) -> list[str]:
        """The users in the cache (those whose filters all died since the last `expire` included)."""
        return list(self._users)

    def ids_tracked(self, user: str, now_ms: float) -> int:
        """How many ids were added to `user`'s live filters (each was new when added)."""
        return sum(w.bloom.count for w in self._live(user, now_ms))

    def estimated_fp_rate(self, user: str, now_ms: float) -> float:
        """The chance that a new id of `user` is taken for seen now: a hit in any live filter."""
        # 1 - prod(1 - p), in logs: a tiny p must not round away against 1.0.
        return -math.expm1(sum(math.log1p(-w.bloom.estimated_fp_rate()) for w in self._live(user, now_ms)))

    def memory_bytes(self) -> int:
        """The bytes of the filters' bit arrays held (Python's object overhead not included)."""
        return sum(w.bloom.size_bytes for windows in self._users.values() for w in windows)

    def __len__(self) -> int:
        return len(self._users)

    def __repr__(self) -> str:
        return (f"ProducerIdCache(window_ms={self.window_ms}, users={len(self._users)}, "
                f"memory_bytes={self.memory_bytes()}, dropped_users={self.dropped_users}, "
                f"overfull_adds={self.overfull_adds})")


@dataclass(frozen=True, slots=True)
class ProducerIdCharge:
    """What one Produce request's producer ids cost: how many were new for the user, the
    throttle (ms), and whether the request is refused (the `reject` action, over quota)."""

    new_ids: int
    throttle_ms: int
    rejected: bool = False


NOTHING = ProducerIdCharge(0, 0)


class ProducerIdQuotaManager:
    """`producer_ids_rate` for one measurement scope: KIP-936's seen-id cache and a Rate of new
    ids per user, with the quota resolved like any user quota (the user's, else `<default>`).

    Only ids new for the user count: each is recorded as 1 in the user's Rate (N samples of W,
    the same Rate as every quota; quota/rate.py), and the throttle is Kafka's rate throttle,
    unbounded like the byte rates': (O - Q) / Q * window, about 1/Q seconds per id over quota.

    `charge(..., strict=False)` (the `throttle` action) remembers and records every new id and
    returns the throttle. `charge(..., strict=True)` (the `reject` action) first looks whether
    counting the request's new ids would take the user over its quota; if so nothing is
    remembered or recorded (a retry of the same ids is judged afresh later) and the request is
    refused, with the throttle that counting them would have cost. Users with no quota are
    measured too once any producer_ids_rate was ever configured, as Kafka does for its quotas.
    """

    def __init__(self, resolver_store: QuotaStore, config: MetricConfig, sensors: Sensors,
                 cache: ProducerIdCache, stats: StatFactory | None = None,
                 shared_ids: SharedIds | None = None) -> None:
        self.config = config
        self.rate = ClientQuotaManager(QuotaKey.PRODUCER_IDS_RATE, resolver_store, config, sensors, stats)
        self.cache = cache
        # With a shared store: the ids counted here, checked against the other replicas' later.
        self.shared_ids = shared_ids
        self.rejections: dict[str, int] = {}  # sanitized user -> Produce requests refused

    @property
    def quotas_enabled(self) -> bool:
        return self.rate.quotas_enabled

    def charge(self, user: str, pids: Iterable[int], now_ms: float, strict: bool = False) -> ProducerIdCharge:
        if not self.rate.quotas_enabled:
            return NOTHING
        cache = self.cache
        if strict:
            fresh = {pid for pid in pids if not cache.seen(user, pid, now_ms)}
            if not fresh:
                return NOTHING
            if not cache.has_room_for(user):
                for pid in fresh:
                    cache.track(user, pid, now_ms)  # each turned away counts in dropped_users
                return NOTHING
            n = len(fresh)
            throttle_ms = self.rate.record_and_get_throttle_ms(user, None, n, now_ms)
            if throttle_ms > 0:
                self.rate.unrecord(user, None, n, now_ms)
                key = sanitize_user(user)
                if key in self.rejections or len(self.rejections) < cache.max_users:
                    self.rejections[key] = self.rejections.get(key, 0) + 1
                return ProducerIdCharge(n, throttle_ms, rejected=True)
            shared = self.shared_ids
            for pid in fresh:
                cache.track(user, pid, now_ms)
                if shared is not None:
                    shared.counted(self.rate, user, pid, now_ms)
            return ProducerIdCharge(n, 0)
        n = 0
        shared = self.shared_ids
        for pid in pids:
            if cache.track(user, pid, now_ms):
                n += 1
                if shared is not None:
                    shared.counted(self.rate, user, pid, now_ms)
        if n == 0:
            return NOTHING
        return ProducerIdCharge(n, self.rate.record_and_get_throttle_ms(user, None, n, now_ms))

    def measure(self, user: str, now_ms: float) -> float:
        """The user's rate of new ids per second."""
        return self.rate.measure(user, None, now_ms)

    def expire(self, now_ms: float) -> None:
        self.cache.expire(now_ms)
        live = {sanitize_user(u) for u in self.cache.users()}
        for key in [k for k in self.rejections if k not in live]:
            del self.rejections[key]
