"""Quota measurements shared between proxy replicas (and worker processes) through a store.

Pure: no I/O and no clock of its own. The proxy's store task (`proxy/store/`) collects what this
replica recorded, writes it to the store, and hands back what all replicas recorded.

The shape (docs/cluster-quotas.md):

- Each replica keeps Kafka's own `Rate` for the bytes it sees, event-aligned as in Kafka, so with
  one replica every throttle is Kafka's to the millisecond.
- Beside it, a `SharedRate` counts the same bytes again in samples aligned to the store's clock,
  `floor(wall_ms / W)`: aligned samples are what replicas can add up. The sync writes this
  replica's absolute total per aligned sample (a retried write never counts twice) and reads the
  sum over all replicas; the difference is the other replicas' bytes, `others[sample]`.
- The rate a quota is checked against is this replica's own rate plus the others' bytes in the
  retained aligned samples divided by the span they cover. The request path adds to two numbers
  and does no I/O.

When the store cannot be reached, `SharedQuotas.degrade` switches every rate to a share of its
quota (see `Degraded`); `recover` switches back.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar, cast

from kafka_quota_proxy.quota.aligned import Degraded, StoreClock
from kafka_quota_proxy.quota.pacer import Pacer
from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.shared_fetch import SharedBucket, SharedFetchRate, SharedPresence
from kafka_quota_proxy.quota.shared_pacer import SharedPacer
from kafka_quota_proxy.quota.shared_rate import SharedRate
from kafka_quota_proxy.quota.token_bucket import TokenBucket
from kafka_quota_proxy.quota.turns import Turns

FailurePolicy = Literal["local_share", "open", "closed"]

Shared = SharedRate | SharedBucket | SharedPresence
S = TypeVar("S", bound=Shared)


@dataclass
class SyncBatch:
    """What one sync writes and reads for one bucket of entities."""

    bucket: int
    writes: dict[str, dict[int, int]] = field(default_factory=dict)  # key -> {sample: absolute}
    reads: dict[str, list[int]] = field(default_factory=dict)  # key -> samples to read


def bucket_of(key: str, buckets: int) -> int:
    """A key's bucket, stable across processes (Python's hash() is salted per process)."""
    h = 2166136261
    for b in key.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h % buckets


def sensor_key_text(kind: str, scope: str, key: Hashable) -> str:
    """The store's name of one measurement: its kind (produce, fetch, mutation), its scope (the
    upstream broker, or "proxy"/"cluster"), and the sensor key's parts. Unit separators keep
    parts apart whatever they contain."""
    parts = key if isinstance(key, tuple) else (key,)
    return "\x1f".join((kind, scope, *map(str, parts)))


class SharedQuotas:
    """Every shared measurement of this replica, by store key, and the sync's bookkeeping."""

    def __init__(self, config: MetricConfig, buckets: int = 16,
                 clock: StoreClock | None = None) -> None:
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {buckets}")
        self.config = config
        self.buckets = buckets
        self.clock = clock or StoreClock()
        self._stats: dict[str, Shared] = {}
        self._fresh: set[str] = set()  # not yet read from the store: read all their samples
        self.degraded_since: float | None = None  # the `now_ms` the store was given up at
        self.policy: FailurePolicy = "local_share"
        self.live_replicas = 1  # replicas with a recent heartbeat, this one included
        self.read_every_ms = 100.0  # the sync's interval
        self.read_ms = -math.inf  # the `now_ms` of the last read
        self.rng = random.Random()  # a fetch's chance of its part of the headroom (judge_fetch)
        # The paced quotas' turns, where the store keeps a queue of them (quota/turns.py): set by
        # a sync whose store does; None, each replica takes its chance of a turn
        # (SharedPacer.admit_wait_ms).
        self.turns: Turns | None = None

    # -- made by the quota managers' sensor stores --------------------------------------------------

    def rate(self, key: str) -> SharedRate:
        # A sensor expired and was made again: the old one's samples are still the truth.
        return self._kept(key, SharedRate, lambda: SharedRate(self.config, key, self))

    def fetch_rate(self, key: str, peers_key: str) -> SharedFetchRate:
        return self._kept(key, SharedFetchRate,
                          lambda: SharedFetchRate(self.config, key, self, peers_key))

    def presence(self, key: str, owner: SharedFetchRate) -> SharedPresence:
        presence = self._kept(key, SharedPresence,
                              lambda: SharedPresence(self.config, key, self, owner))
        presence.owner = owner
        return presence

    def bucket(self, key: str, rate_per_s: float) -> SharedBucket:
        return self._kept(key, SharedBucket,
                          lambda: SharedBucket(rate_per_s, self.config, key, self))

    def _kept(self, key: str, kind: type[S], make: Callable[[], S]) -> S:
        """The stat under `key` if it is a `kind`, else a new one from `make`, adopted."""
        found = self._stats.get(key)
        if isinstance(found, kind):
            return found
        stat = make()
        self._adopt(key, stat)
        return stat

    def _adopt(self, key: str, stat: Shared) -> None:
        self._stats[key] = stat
        stat.listed = True
        self._fresh.add(key)
        # Until its first read, the stat knows nothing of the others: it takes each live replica
        # to send as much as this one (its fair share), not nothing. Taking nothing let a replica
        # whose client had just become the busy one admit a sync interval's worth at line speed
        # (4.6 MiB in 75 ms in a simulation of 10 replicas; the shifting traffic's overshoot).
        stat.ratio = float(max(0, self.live_replicas - 1))
        stat.since_read = 0.0
        if self.degraded_since is not None:
            stat.degraded = self._share_for(0.0)

    def clock_moved(self) -> None:
        """The sync moved `clock.offset_ms`: every open sample's bounds are worked out again at
        its next count."""
        for stat in self._stats.values():
            stat._cur_from = stat._cur_until = -math.inf

    def relist(self, stat: Shared) -> None:
        """A stat let go for being idle is recording again: sync it again (its old samples are
        read back from the store as for a new one)."""
        if self._stats.get(stat.key) is None:
            self._adopt(stat.key, stat)
        else:
            stat.listed = True

    def __len__(self) -> int:
        return len(self._stats)

    # -- the sync ---------------------------------------------------------------------------------

    def sample_floor(self, now_ms: float) -> int:
        return self.clock.sample(now_ms, self.config.window_ms) - self.config.samples

    def collect(self, now_ms: float, settle_ms: float | None = None) -> list[SyncBatch]:
        """One batch per bucket with work: the samples each key wrote since the last sync, and the
        samples to read back (all retained for a new key; for a key already read, the current
        one, and the one before while it may still be written: during the first `settle_ms` of
        the current sample, when the other replicas' first syncs since the boundary bring their
        last bytes of it; always when None). Keys idle for longer than the retained samples are
        let go."""
        window = self.config.window_ms
        current = self.clock.sample(now_ms, window)
        floor = current - self.config.samples
        horizon = (self.config.samples + 1) * window
        into = now_ms + self.clock.offset_ms - current * window
        recent = [current - 1, current] if settle_ms is None or into < settle_ms else [current]
        everything = list(range(floor, current + 1))
        batches: dict[int, SyncBatch] = {}
        for key in list(self._stats):
            stat = self._stats[key]
            writes = stat.unsynced(floor)
            if (not writes and not stat.own and not stat.others and key not in self._fresh
                    and now_ms - stat.seen_ms > horizon):
                stat.listed = False
                del self._stats[key]
                self._fresh.discard(key)
                continue
            b = bucket_of(key, self.buckets)
            batch = batches.get(b)
            if batch is None:
                batch = batches[b] = SyncBatch(b)
            if writes:
                batch.writes[key] = writes
            batch.reads[key] = everything if key in self._fresh else recent
        return [batches[b] for b in sorted(batches)]

    def applied(self, batch: SyncBatch, totals: dict[str, dict[int, int]], lost: bool,
                now_ms: float) -> None:
        """The store took `batch.writes` and answered `totals` (key -> {sample: sum over all
        replicas}). `lost`: the store had lost this replica's earlier writes to the bucket (it
        restarted empty, or evicted them): everything still retained is written again next time."""
        floor = self.sample_floor(now_ms)
        self.read_ms = now_ms
        for key, writes in batch.writes.items():
            stat = self._stats.get(key)
            if stat is not None:
                stat.mark_pushed(writes)
        for key, sums in totals.items():
            stat = self._stats.get(key)
            if stat is None:
                continue
            stat.set_totals(sums, floor, now_ms)
            self._fresh.discard(key)
        if lost:
            for key in batch.reads:
                stat = self._stats.get(key)
                if stat is not None:
                    stat.forget_pushed()
                    self._fresh.add(key)

    def until_next_read_ms(self, now_ms: float) -> int:
        """How long until the sync is next due to read, in whole ms (a whole interval before the
        first read, or when the read is late): what a fetch refused on the others' predicted bytes
        alone waits for. Not less: each try before the next read would get another chance at the
        same headroom (a 1 ms wait before the first read let 10 replicas take 23 MiB in a second
        of a 1 MiB/s quota)."""
        every = self.read_every_ms
        left = self.read_ms + every - now_ms
        return int(math.ceil(left if 1 <= left <= every else every))

    # -- the store out of reach --------------------------------------------------------------------

    def _share_for(self, recent_share: float) -> Degraded:
        if self.policy == "open":
            return Degraded(1.0)
        live = max(1, self.live_replicas)
        if self.policy == "closed":
            return Degraded(1.0 / live)
        share = max(recent_share, 1.0 / live)
        return Degraded(min(1.0, share))

    def degrade(self, now_ms: float, policy: FailurePolicy | None = None) -> None:
        """Enforce each quota as this replica's share of it, from what it last knew: its fraction of
        the fleet's bytes in the retained samples, averaged over the reads of the last
        PART_HORIZON_MS, never below 1/N_live (`local_share`); 1/N_live
        (`closed`: never over the quota in sum, however the traffic moves); or the whole quota on
        each replica (`open`)."""
        if policy is not None:
            self.policy = policy
        if self.degraded_since is None:
            self.degraded_since = now_ms
        for stat in self._stats.values():
            part = stat.part
            if part < 0:
                mine, total = stat.window_bytes(now_ms)
                part = mine / total if total > 0 else 0.0
            stat.degraded = self._share_for(part)

    def recover(self) -> None:
        """Back to the store's sums. What was recorded meanwhile is still in `own` and is written
        on the next sync; nothing was written twice, since writes are absolute."""
        self.degraded_since = None
        for key, stat in self._stats.items():
            stat.degraded = None
            self._fresh.add(key)


class ScopedShared:
    """The `StatFactory` of one quota kind in one scope: its stats are shared through `shared`
    under "<kind>\\x1f<scope>\\x1f<sensor key parts>"."""

    __slots__ = ("shared", "kind", "scope")

    def __init__(self, shared: SharedQuotas, kind: str, scope: str) -> None:
        self.shared = shared
        self.kind = kind
        self.scope = scope

    def rate(self, key: Hashable) -> Rate:
        text = sensor_key_text(self.kind, self.scope, key)
        if self.kind == "fetch":
            return self.shared.fetch_rate(text, sensor_key_text("fetchers", self.scope, key))
        rate = self.shared.rate(text)
        rate.owes = self.kind == "produce"
        return rate

    def bucket(self, key: Hashable, rate_per_s: float) -> TokenBucket:
        return self.shared.bucket(sensor_key_text(self.kind, self.scope, key), rate_per_s)

    def pacer(self, rate: Rate) -> Pacer:
        return SharedPacer.of(cast(SharedRate, rate))  # `rate` made it: always a SharedRate


class Uncounts(Protocol):
    """Takes back a count (a quota manager's `unrecord`)."""

    def unrecord(self, user: str, client_id: str | None, value: float, now_ms: float) -> None: ...


class SharedIds:
    """Producer ids this replica counted as new for a user, waiting to be checked against the
    fleet's: an id another replica had already counted is taken back here, so an id seen through
    two replicas counts once (`producer_ids_rate`). Only local misses come here: an id this
    replica's own filters know was never counted again."""

    def __init__(self, window_ms: int, clock: StoreClock, max_pending: int = 100_000) -> None:
        self.window_ms = window_ms
        self.clock = clock
        self.max_pending = max_pending
        self.pending: list[tuple[Uncounts, str, int, int]] = []  # (who counted, user, id, window)
        self.dropped = 0  # not checked because `pending` was full (the store out of reach)

    def counted(self, counter: Uncounts, user: str, pid: int, now_ms: float) -> None:
        if len(self.pending) >= self.max_pending:
            self.dropped += 1
            return
        self.pending.append((counter, user, pid, self.clock.sample(now_ms, self.window_ms)))

    def take(self) -> list[tuple[Uncounts, str, int, int]]:
        taken, self.pending = self.pending, []
        return taken

    def give_back(self, taken: list[tuple[Uncounts, str, int, int]]) -> None:
        self.pending[:0] = taken[: max(0, self.max_pending - len(self.pending))]
