"""The shared stats beside `SharedRate`: a consumer quota's (`SharedFetchRate`, with the count
of replicas fetching, `SharedPresence`) and the controller mutations' token bucket
(`SharedBucket`). Pure: no I/O, no clock of its own."""

from __future__ import annotations

from typing import Protocol

from kafka_quota_proxy.quota.aligned import SLOTS, AlignedCounts, Home
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.shared_rate import SharedRate
from kafka_quota_proxy.quota.token_bucket import TokenBucket
from kafka_quota_proxy.quota.turns import TURN_READS


class FetchHome(Home, Protocol):
    """The registry, as a consumer quota's stat sees it: it also keeps the count of replicas
    fetching on each consumer quota."""

    def presence(self, key: str, owner: SharedFetchRate) -> SharedPresence: ...


class SharedFetchRate(SharedRate):
    """A consumer quota's `SharedRate`: the others' bytes between reads are predicted from how
    many other replicas' clients fetched lately (`peers`), not from their part of the bytes. A
    fetch is all or nothing, and a refused one leaves no bytes: by the bytes, a replica whose
    client alone was being served took the others to want nothing, and took the whole headroom
    while they took their parts of it (3 replicas in `bench.shared_sim`: 11 s windows of 2.1x)."""

    __slots__ = ("peers", "turning")

    # Consumers keep the span from the oldest aligned sample's start: from their first bytes,
    # 3 replicas' consumers under Kafka's rule read 2.5% less than one replica where they read
    # 1.2% less before (1 MB fetches; 256 KiB: 2.0% against 0.4%; `bench.many_connections_sim`,
    # 15-255 s, 20 seeds), and their turns were tuned on it.
    first_bytes_span = False

    def __init__(self, config: MetricConfig, key: str, home: FetchHome,
                 peers_key: str) -> None:
        SharedRate.__init__(self, config, key, home)
        self.peers = home.presence(peers_key, self)
        self.turning = False  # Kafka's rule, taking the store's turns: nothing predicted

    def takes_turns(self) -> bool:
        """Kafka's mode (not paced): the fetches of this quota take the store's turns
        (`fetch_turn`), where it keeps them and more than one replica is live."""
        home = self.home
        return home.turns is not None and self.degraded is None and home.live_replicas > 1

    def fetch_turn(self, now_ms: float, size: float, bound: float) -> tuple[float, int | None]:
        """A fetch of `size`, just recorded, judged by Kafka's rule on what is known (this
        replica's bytes and the others' as last read), the replicas taking turns for the
        headroom: over the quota, (rate, None), the caller throttles by Kafka's rule, and the
        replica asks for a turn shortly before the client is back (`Turns.due`); within it, the
        fetch is delivered (_, 0) where this replica heads the entity's queue, else refused
        until the next read (_, ms), the replica asking for a turn. The head hands the turn on
        once it has had a few sync intervals' worth of the quota (`Turns.paid`)."""
        self.turning = True
        self.ratio = 0.0
        known = self.measure(now_ms)
        home = self.home
        turns = home.turns
        assert turns is not None
        key = self.key
        if known > bound:
            return known, None
        if key in turns.heads:
            paid_ms = size * 1000.0 / bound
            if paid_ms >= TURN_READS * home.read_every_ms:
                turns.leave(key)
            else:
                turns.paid(key, now_ms, now_ms + paid_ms)
            return known, 0
        turns.wait(key, now_ms + home.read_every_ms)
        return known, home.until_next_read_ms(now_ms)

    def muted(self, now_ms: float, due_ms: float) -> None:
        turns = self.home.turns
        if turns is None:
            return
        if due_ms - now_ms <= 2 * self.home.read_every_ms:
            turns.wait(self.key, due_ms)
        else:
            turns.leave(self.key)
            turns.due(self.key, due_ms)

    def _enter_sample(self, now_ms: float) -> None:
        """The first bytes of an aligned sample (a fetch's): this replica fetched in it. Marked
        here, about once a window, not on every record: `record` stays `SharedRate`'s."""
        AlignedCounts._enter_sample(self, now_ms)
        peers = self.peers
        if not peers._cur_from <= now_ms < peers._cur_until:
            peers.mark(now_ms)

    def set_totals(self, totals: dict[int, int], sample_floor: int, now_ms: float) -> None:
        SharedRate.set_totals(self, totals, sample_floor, now_ms)
        peers = self.peers
        if self.turning and self.takes_turns():
            self.ratio = 0.0
        elif peers.read:
            self.ratio = peers.fetching(now_ms)


class SharedPresence(AlignedCounts):
    """Whether this replica's clients fetched on one consumer quota in each aligned sample (1 or
    nothing, absolute): summed by the store, the number of replicas that did. What a
    `SharedFetchRate` splits the headroom between reads by."""

    __slots__ = SLOTS + ("owner", "read")

    def __init__(self, config: MetricConfig, key: str, home: Home,
                 owner: SharedFetchRate) -> None:
        self._init_counts(config, key, home)
        self.owner = owner
        self.read = False  # the store's count was read at least once

    def mark(self, now_ms: float) -> None:
        """This replica fetched at `now_ms`, outside the open sample's bounds."""
        self._enter_sample(now_ms)
        self.own[self._cur_sample] = 1
        self.seen_ms = now_ms

    def fetching(self, now_ms: float) -> float:
        """How many other replicas fetched in one aligned sample of the window, at most
        N_live - 1. Over the whole window, not the last samples: a fleet that shared a long
        throttle comes back at once, and each replica must still count the others."""
        low = self.clock.sample(now_ms, self._aligned_window) - self._keep
        seen = max((v for s, v in self.others.items() if s >= low), default=0)
        return float(min(seen, max(0, self.home.live_replicas - 1)))

    def set_totals(self, totals: dict[int, int], sample_floor: int, now_ms: float) -> None:
        AlignedCounts.set_totals(self, totals, sample_floor, now_ms)
        self.read = True
        owner = self.owner
        owner.ratio = 0.0 if owner.turning and owner.takes_turns() else self.fetching(now_ms)


class SharedBucket(AlignedCounts, TokenBucket):
    """Kafka's `TokenBucket` (controller mutations), also charged with the other replicas'
    permits as the store reports them: credits are then spent once across the fleet. While the
    store is out of reach it is this replica's alone (the whole quota here)."""

    __slots__ = SLOTS

    def __init__(self, rate_per_s: float, config: MetricConfig, key: str, home: Home) -> None:
        TokenBucket.__init__(self, rate_per_s, config)
        self._init_counts(config, key, home)

    def record(self, value: float, now_ms: float) -> None:
        TokenBucket.record(self, value, now_ms)
        self._count(value, now_ms)

    def set_totals(self, totals: dict[int, int], sample_floor: int, now_ms: float) -> None:
        """Also charge the bucket with what the other replicas spent since the last read."""
        before = dict(self.others)
        AlignedCounts.set_totals(self, totals, sample_floor, now_ms)
        spent = sum(v - before.get(s, 0) for s, v in self.others.items() if s in totals)
        if spent > 0 and self.degraded is None:
            TokenBucket.record(self, spent, now_ms)
