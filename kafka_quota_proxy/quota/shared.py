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
from typing import Literal, Protocol, TypeVar

from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.token_bucket import TokenBucket
from kafka_quota_proxy.quota.turns import TURN_READS, Turns

FailurePolicy = Literal["local_share", "open", "closed"]


class StoreClock:
    """Wall time in the store's terms: the proxy's monotonic `now_ms` plus `offset_ms`.

    `offset_ms` is set by the sync from the store's own TIME, so replicas on hosts whose clocks
    differ still agree on which aligned sample a byte belongs to."""

    __slots__ = ("offset_ms",)

    def __init__(self, offset_ms: float = 0.0) -> None:
        self.offset_ms = offset_ms

    def sample(self, now_ms: float, window_ms: int) -> int:
        return int((now_ms + self.offset_ms) // window_ms)


@dataclass(slots=True)
class Degraded:
    """How a rate is enforced while the store is out of reach: as `share` of its quota, that is,
    its own rate divided by `share` is checked against the whole quota. share 1.0 is every replica
    on its own (policy `open`)."""

    share: float


SLOTS = ("key", "clock", "_aligned_window", "_keep", "own", "pushed", "others", "_others_sum",
         "_cur_sample", "_cur_value", "_cur_from", "_cur_until", "degraded", "seen_ms", "home",
         "listed", "since_read", "ratio", "part", "part_ms", "part_since", "others_from",
         "read_wall")


PART_HORIZON_MS = 20_000.0  # how long a replica's part of the fleet's bytes is averaged over


class AlignedCounts:
    """This replica's counts per aligned sample and the others' as last read: what a shared stat
    adds to Kafka's. A mixin; the stats list its attributes in their slots (`SLOTS`)."""

    key: str
    clock: StoreClock
    _aligned_window: int
    _keep: int
    own: dict[int, int]  # this replica's count per aligned sample, absolute
    pushed: dict[int, int]  # what the store was last given
    others: dict[int, int]  # the other replicas' count per aligned sample, as last read
    # When the others' first bytes in each of those samples came, as well as the reads tell it
    # (store time, ms): the oldest one's starts their span (`_others_in_window`). Kept only where
    # `first_bytes_span`.
    others_from: dict[int, float]
    read_wall: float  # store time of this stat's last read
    _others_sum: int
    _cur_sample: int  # the open aligned sample, summed in `_cur_value` first
    # The others' bytes are a rate from their first bytes in the oldest sample, as Kafka's Rate
    # runs from its oldest sample's first event (`SharedRate._others_in_window`); False: from
    # that aligned sample's start, and `others_from` is not kept.
    first_bytes_span = False
    _cur_value: float
    # The open sample's bounds in `now_ms` terms, at the clock offset it was opened under: the
    # request path compares `now_ms` with them instead of working out the sample each time.
    # `SharedQuotas.clock_moved` voids them when the sync moves the offset.
    _cur_from: float
    _cur_until: float
    degraded: Degraded | None
    seen_ms: float  # the last `now_ms` recorded at
    home: SharedQuotas  # the registry the sync reads
    listed: bool  # False once the registry let this stat go for being idle
    # This replica's bytes since the others' were last read, and how many bytes the others have
    # lately added for each of its own (capped at N_live - 1): until the next read, the others
    # are taken to go on in that proportion, so that replicas running at once do not each admit
    # all the headroom they saw.
    since_read: float
    ratio: float
    # This replica's part of the fleet's bytes in the window, averaged over the reads of the last
    # PART_HORIZON_MS or so (-1 before the first): what it enforces as its share of the quota if the
    # store fails. One window's part alone swings with the bursts and throttles of Kafka's rate (a
    # replica that had just burst held 63% of the window under even traffic, and enforcing that
    # put three replicas at 1.57x the quota).
    part: float
    part_ms: float  # the read it was last averaged at
    part_since: float  # the first read it was averaged from

    def _init_counts(self, config: MetricConfig, key: str, home: SharedQuotas) -> None:
        self.key = key
        self.clock = home.clock
        self.home = home
        self.listed = True
        self._aligned_window = config.window_ms
        self._keep = config.samples  # samples older than the current one that still count
        self.own = {}
        self.pushed = {}
        self.others = {}
        self.others_from = {}
        self.read_wall = -math.inf
        self._others_sum = 0
        self._cur_sample = -1
        self._cur_value = 0.0
        self._cur_from = self._cur_until = -math.inf
        self.degraded = None
        self.seen_ms = -math.inf
        self.since_read = 0.0
        self.ratio = 0.0
        self.part = -1.0
        self.part_ms = self.part_since = -math.inf

    def _count(self, value: float, now_ms: float) -> None:
        if not self._cur_from <= now_ms < self._cur_until:
            self._enter_sample(now_ms)
        self._cur_value += value
        self.seen_ms = now_ms

    def _enter_sample(self, now_ms: float) -> None:
        """`now_ms` is outside the open sample's bounds (about once a window): the count moves on
        to the aligned sample it falls in (the same one if only the bounds were voided)."""
        w = self._aligned_window
        offset = self.clock.offset_ms
        sample = int((now_ms + offset) // w)
        self._cur_from = sample * w - offset
        self._cur_until = self._cur_from + w
        if sample == self._cur_sample:
            return
        self._flush_current()
        self._cur_sample = sample
        if not self.listed:
            self.home.relist(self)  # type: ignore[arg-type]  # only the stats below mix this in

    def _flush_current(self) -> None:
        if self._cur_value:
            s = self._cur_sample
            self.own[s] = self.own.get(s, 0) + round(self._cur_value)
            self._cur_value = 0.0

    def unsynced(self, sample_floor: int) -> dict[int, int]:
        """The aligned samples (from `sample_floor` on) whose count differs from what the store
        was last given: {sample: absolute count}. Older ones are dropped."""
        self._flush_current()
        own, pushed = self.own, self.pushed
        for s in [s for s in own if s < sample_floor]:
            del own[s]
        for s in [s for s in pushed if s < sample_floor]:
            del pushed[s]
        return {s: v for s, v in own.items() if pushed.get(s) != v}

    def mark_pushed(self, written: dict[int, int]) -> None:
        self.pushed.update(written)

    def forget_pushed(self) -> None:
        """The store lost what this replica wrote: write it all again."""
        self.pushed.clear()

    def set_totals(self, totals: dict[int, int], sample_floor: int, now_ms: float) -> None:
        """The store's sums over all replicas for these samples: the others' part is the sum less
        what this replica had written there (the store's sum includes exactly that)."""
        others, others_from = self.others, self.others_from
        w = self._aligned_window
        wall = now_ms + self.clock.offset_ms
        # Bytes this read is the first to show in a sample were recorded since the last read, less
        # the sync interval another replica may have held them for: about an interval before this
        # read, on average. (On a stat's first read: anywhere in their sample.)
        track = self.first_bytes_span
        every = self.home.read_every_ms
        came_after = self.read_wall - every
        came_about = wall - every
        self.read_wall = wall
        for s, total in totals.items():
            theirs = total - self.pushed.get(s, 0)
            if theirs > 0:
                if track and s not in others:
                    start = s * w
                    others_from[s] = start if came_after < start else max(start, came_about)
                others[s] = theirs
            else:
                others.pop(s, None)
                others_from.pop(s, None)
        for s in [s for s in others if s < sample_floor]:
            del others[s]
            others_from.pop(s, None)
        self._others_sum = sum(others.values())
        mine, total = self.window_bytes(now_ms)
        if total > 0:
            now_part = mine / total
            if self.part < 0:
                self.part, self.part_ms, self.part_since = now_part, now_ms, now_ms
            else:
                # The mean over the reads so far, then over the last PART_HORIZON_MS (a moving one).
                span = min(PART_HORIZON_MS, now_ms - self.part_since)
                weight = min(1.0, max(0.0, now_ms - self.part_ms) / span) if span > 0 else 1.0
                self.part += (now_part - self.part) * weight
                self.part_ms = now_ms
        theirs = total - mine
        cap = max(0, self.home.live_replicas - 1)
        if mine > 0:
            self.ratio = min(theirs / mine, cap) if theirs > 0 else 0.0
        else:
            # This replica sent nothing lately (the others may have, or, when the whole window is
            # idle, nobody did): each live replica is taken to send as much as it will, as for a
            # new stat. Taking an idle fleet to go on sending nothing let every replica take the
            # whole window at once when all came back from a throttle they had shared.
            self.ratio = float(cap)
        self.since_read = 0.0

    def _read_growth(self, totals: dict[int, int], sample_floor: int, now_ms: float) -> dict[int, int]:
        """`set_totals`, returning by how much the others' count grew in each sample read (what
        the read brought; negative where it shrank)."""
        others = self.others
        before = {s: others.get(s, 0) for s in totals}
        AlignedCounts.set_totals(self, totals, sample_floor, now_ms)
        return {s: others.get(s, 0) - was for s, was in before.items()}

    def window_bytes(self, now_ms: float) -> tuple[int, int]:
        """(this replica's, all replicas') counts in the retained aligned samples: the replica's
        share of the recent traffic, for the degraded mode."""
        self._flush_current()
        low = self.clock.sample(now_ms, self._aligned_window) - self._keep
        mine = sum(v for s, v in self.own.items() if s >= low)
        theirs = sum(v for s, v in self.others.items() if s >= low)
        return mine, mine + theirs


class Owed:
    """A throttle this replica worked out (or found none needed) for a request at `at_ms`, settled
    as the reads after it show the other replicas' bytes it did not know of then (`SharedRate.owe`):
    Kafka's throttle of that request would have been `slack_ms` plus `per_byte_ms` for each of
    those bytes that came before it, `missed`."""

    __slots__ = ("at_ms", "slack_ms", "per_byte_ms", "reads", "read_ms", "into", "missed", "fresh",
                 "guess")

    def __init__(self, at_ms: float, slack_ms: float, per_byte_ms: float, reads: int,
                 read_ms: float) -> None:
        self.at_ms = at_ms
        self.slack_ms = slack_ms  # Kafka's throttle on what was known, negative if under
        self.per_byte_ms = per_byte_ms
        self.reads = reads  # the stat's reads so far: the next one is the first after `at_ms`
        self.read_ms = read_ms  # the last read before `at_ms`
        self.into = 1.0  # how far `at_ms` came into the interval between its reads, once known
        self.missed = 0.0
        self.fresh = False  # made while the stat was young (its first YOUNG_READS reads)
        # Made while young: the others' bytes before it, guessed until the young reads settle it.
        self.guess = 0.0

    @property
    def until_ms(self) -> float:
        """Until when Kafka's throttle of the request would hold its connection, on what the reads
        since have shown."""
        missed = self.missed if self.missed > self.guess else self.guess
        return self.at_ms + self.slack_ms + missed * self.per_byte_ms

    def __repr__(self) -> str:
        return (f"Owed(at_ms={self.at_ms}, slack_ms={self.slack_ms:.1f}, "
                f"per_byte_ms={self.per_byte_ms:.3g}, reads={self.reads}, missed={self.missed:.0f})")


OWED_PENDING = 4096  # a stat's requests still to settle, at most (the oldest are let go)
# A stat's first reads, which may not yet show what the others recorded before it began: each
# writes at its own sync, up to a sync interval later. A request made meanwhile owes for the
# others' bytes guessed (as many as this replica's each, `_adopt`'s guess) until they settle it.
YOUNG_READS = 2


class SharedRate(AlignedCounts, Rate):
    """Kafka's `Rate` for this replica's own bytes, plus the other replicas' bytes from the store.

    `record` is `Rate.record` and one addition to the current aligned sample. `measure` adds
    `others_rate`. Nothing here blocks or awaits.
    """

    __slots__ = SLOTS + ("owes", "settles", "reads", "pending")

    first_bytes_span = True  # AlignedCounts.first_bytes_span

    def __init__(self, config: MetricConfig, key: str, home: SharedQuotas) -> None:
        Rate.__init__(self, config)
        self._init_counts(config, key, home)
        # Kafka's throttles of this rate are settled at the reads (`owe`): a Produce quota's,
        # whose connection the proxy can hold for what is owed (QuotaCharge.hold_ms).
        self.owes = False
        self.settles = False  # owed lately, Kafka's mode: the others' bytes are not predicted
        self.reads = 0
        self.pending: list[Owed] = []  # requests the next two reads settle

    def owe(self, now_ms: float, bound: float) -> tuple[float, Owed | None]:
        """Kafka's mode, with the quota shared: a request was just recorded. Returns its rate
        (this replica's bytes and the others' as last read) and, but while the store is out of
        reach, what it owes: Kafka's throttle of it on that rate, to be settled as the next reads
        bring the bytes the others recorded before it (`Owed.until_ms`).

        One replica's broker knows every byte before a request when it throttles it; a replica
        knows the others' only up to its last read. Predicting them from this replica's own bytes
        (`ratio`) fits a steady stream, not a flat-out producer's 1 MB requests: each of 10
        replicas took its one request to stand for nine more and throttled for them, and the
        fleet took 0.99 of the quota where one replica gives Kafka's 1.45
        (`bench.many_connections_sim`). Settled at the reads instead, a request owes Kafka's
        throttle of it on the bytes that came before it, known a read or two later: the
        connection is held for what is left of it (QuotaCharge.hold_ms)."""
        if self.degraded is not None:
            return self.measure(now_ms), None
        if not self.settles:
            self.settles = True
            self.ratio = 0.0  # nothing predicted: the reads settle (`_reveal`)
        measured = self.measure(now_ms)
        window_ms = Rate.window_size_ms(self, now_ms)
        _, span_s = self._others_in_window(now_ms + self.clock.offset_ms)
        owed = Owed(now_ms, (measured - bound) / bound * window_ms, window_ms / (span_s * bound),
                    self.reads, self.home.read_ms)
        if self.reads < YOUNG_READS:
            owed.fresh = True
            # Young: the others' first bytes may not be in the store yet. Not told (a guess told
            # is a mute that cannot be taken back: 10 replicas each taking the others to send
            # nine times its first megabyte muted every client for seconds, and they came back
            # together), but held for until the young reads show them (QuotaCharge.hold_ms).
            owed.guess = max(0, self.home.live_replicas - 1) * float(self.window_bytes(now_ms)[0])
        pending = self.pending
        if len(pending) >= OWED_PENDING:
            del pending[: OWED_PENDING // 2]
        pending.append(owed)
        return measured, owed

    def _reveal(self, totals: dict[int, int], sample_floor: int, now_ms: float) -> None:
        """A read while throttles are settled (`owe`): the others' new bytes settle the requests
        since the last two reads, and none are predicted until the next read.

        Each replica writes what it recorded since its last sync, the syncs at even intervals in
        no common phase: of the bytes the first read after a request brings, a part
        1 - (1-u)^2/2 came before it, u being how far into the interval between the reads it
        came; of the second read's, u^2/2; later reads bring none from before it."""
        grew = self._read_growth(totals, sample_floor, now_ms)
        recent = self.clock.sample(now_ms, self._aligned_window) - 1
        new = new_recent = 0
        for s, added in grew.items():
            if added > 0:
                new += added
                if s >= recent:
                    new_recent += added
        self.ratio = 0.0
        self.reads += 1
        reads = self.reads
        still = []
        for owed in self.pending:
            if owed.fresh:
                # Made while the stat was young, settled by each young read (the first may not
                # show every other replica's first bytes yet): the others' bytes of the samples
                # before the last two came before the request; those of the last two came at
                # about the same time as this replica's first ones (a fleet starting at once),
                # and on one broker a request would find some of them before it, in its place in
                # that order, drawn here. Taking them all before it, every replica held its
                # clients for all the others' first bytes, and together.
                owed.missed += new - new_recent + new_recent * self.home.rng.random()
                owed.into = 0.0
                if reads < YOUNG_READS:
                    still.append(owed)
                else:
                    owed.guess = 0.0  # settled: what the young reads showed, not the guess
            elif owed.reads + 1 == reads:
                span = now_ms - owed.read_ms
                u = (owed.at_ms - owed.read_ms) / span if span > 0 else 1.0
                u = owed.into = 1.0 if u > 1.0 else 0.0 if u < 0.0 else u
                owed.missed += new * (1.0 - (1.0 - u) ** 2 / 2.0)
                still.append(owed)
            else:
                u = owed.into
                owed.missed += new * (u * u / 2.0)
        self.pending = still

    def record(self, value: float, now_ms: float) -> None:
        Rate.record(self, value, now_ms)
        # AlignedCounts._count, inlined: this runs on every charged request.
        if not self._cur_from <= now_ms < self._cur_until:
            self._enter_sample(now_ms)
        self._cur_value += value
        self.since_read += value
        self.seen_ms = now_ms

    def _others_in_window(self, wall: float) -> tuple[int, float]:
        """The other replicas' bytes in the retained aligned samples at store time `wall`, and the
        span they are a rate over: from the first of them in the oldest non-empty sample to now
        (`others_from`), at least (N-1) windows.

        From the first bytes, as Kafka's samples start at their first event, not from the aligned
        sample's start: flat-out producers' 1 MB requests seconds apart leave the oldest sample
        empty for about half a second before its first, and a span from its start read the
        others' rate 2.9% low, settled each throttle 9% short of Kafka's on the same bytes, and
        gave 10 replicas 2.6% more than one replica (`bench.many_connections_sim`, 15-255 s)."""
        w = self._aligned_window
        low = int(wall // w) - self._keep
        total = 0
        oldest = None
        for s, v in self.others.items():
            if s >= low:
                total += v
                if oldest is None or s < oldest:
                    oldest = s
        span: float = (self._keep - 1) * w
        if oldest is not None:
            span = max(wall - self.others_from.get(oldest, oldest * w), span, 1.0)
        return total, span / 1000.0

    def others_rate(self, now_ms: float) -> float:
        """The other replicas' bytes per second: those read from the store, and those predicted
        since the read (`ratio` x this replica's bytes since)."""
        predicted = self.ratio * self.since_read
        if not self._others_sum and not predicted:
            return 0.0
        total, span_s = self._others_in_window(now_ms + self.clock.offset_ms)
        if total <= 0 and not predicted:
            return 0.0
        return (total + predicted) / span_s

    def judge_fetch(self, now_ms: float, size: float, measured: float,
                    bound: float) -> tuple[float, int | None]:
        """A fetch of `size`, just recorded, measured `measured` (with the others' predicted
        bytes) over `bound`. Returns (the rate a throttle is computed from, None) for Kafka's rule,
        or (_, ms): the decision, 0 to deliver it, else refuse it and throttle for `ms`.

        Over the quota on what is known (this replica's bytes and the others' as last read), it
        is refused as on Kafka, throttled by that rate. Under it, it is over only on the others'
        bytes predicted since the read: the headroom the read left is this replica's in its part
        of the fleet's bytes, 1 / (1 + `ratio`), and a fetch is all or nothing, so one that does
        not fit whole in what is left of that part is delivered with the probability that fits,
        left / size. Each replica then takes its part of the headroom on average (they add up to
        the headroom, not N times it), and a replica whose part is small still gets its turns
        (a floor of a whole fetch let 10 replicas each take one: 11 s windows of 1.6-1.7x). A
        refused one waits for the next read, not for a throttle computed from bytes predicted."""
        ratio = self.ratio
        if self.degraded is not None or not ratio or size <= 0:
            return measured, None
        theirs, span_s = self._others_in_window(now_ms + self.clock.offset_ms)
        known = Rate.measure(self, now_ms) + theirs / span_s
        if known > bound:
            return known, None
        headroom = (bound - known) * span_s  # after this fetch, if nobody else sent meanwhile
        chance = 1.0 + (headroom - ratio * self.since_read) / ((1.0 + ratio) * size)
        home = self.home
        if chance > 0.0 and home.rng.random() < chance:
            return known, 0
        return known, home.until_next_read_ms(now_ms)

    def quota_share(self) -> float:
        """This replica's part of the fleet's bytes lately (`part`), or an even part of the live
        replicas' before the first read, or the degraded share: paced at that part of the quota,
        replicas pacing the same client at once add up to the quota, not N times it."""
        degraded = self.degraded
        if degraded is not None:
            return degraded.share
        if self.part > 0:
            return self.part
        return 1.0 / max(1, self.home.live_replicas)

    def _pace_credit_ms(self) -> float:
        # Every replica's clients may find the fleet idle at once: each takes its part of the
        # credit, so that together they take Kafka's first allowance once, not once each.
        return Rate._pace_credit_ms(self) / max(1, self.home.live_replicas)

    def _pace_part(self) -> float:
        # Until the next read, the others are taken to go on as they lately did, `ratio` bytes for
        # each of this replica's (as for Kafka's rate, `others_rate`): this replica's own bytes
        # are paced at its part of the quota, and the read puts the others' real bytes in place
        # of that guess (`set_totals`). Where the store keeps turns, at the whole quota: the
        # others wait for their turn (quota/turns.py). While the store is out of reach, at its
        # share of it.
        degraded = self.degraded
        if degraded is not None:
            return degraded.share
        return 1.0 if self.home.turns is not None else 1.0 / (1.0 + self.ratio)

    def admit_wait_ms(self, now_ms: float) -> float:
        wait = self._admit_at - now_ms
        home = self.home
        turns = home.turns
        if turns is not None and self.degraded is None:
            # The store keeps turns (quota/turns.py): due, the client goes when this replica's
            # claim heads the queue, else at a read. Its stat is read again if it was let go for
            # being idle while its client was muted, so that it learns the others' bytes.
            if not self.listed:
                home.relist(self)
            if wait <= 0 and self.key not in turns.heads:
                wait = home.until_next_read_ms(now_ms)
            turns.wait(self.key, now_ms + wait)
            return wait
        ratio = self.ratio
        if wait > 0 or not ratio or self.degraded is not None:
            return wait
        # Due, and the others' clients are taken to be due too: each replica would let one
        # request in before it sees the others' at the next read, all at once (10 replicas of a
        # 1 MB producer each took turns in step, 11 s windows of 1.65-1.8x). So one of them,
        # on average, goes now: each with the chance of its part, the others at the next read.
        if self.home.rng.random() < 1.0 / (1.0 + ratio):
            return wait
        return self.home.until_next_read_ms(now_ms)

    def pace(self, size: float, bound: float, now_ms: float) -> float:
        self.settles = False  # paced now: the pace counts the others' bytes (`set_totals`)
        turns = self.home.turns
        if turns is None or self.degraded is not None:
            return Rate.pace(self, size, bound, now_ms)
        at = Rate.pace(self, size, bound, now_ms)
        # Paced at the whole quota (`_pace_part`): these bytes were paid for from `at - paid`.
        turns.paid(self.key, at - size * 1000.0 / bound, at)
        return at

    def set_totals(self, totals: dict[int, int], sample_floor: int, now_ms: float) -> None:
        if self.settles and self.degraded is None:
            self._reveal(totals, sample_floor, now_ms)
            return
        bound = self._pace_bound
        if bound is None or self.degraded is not None:
            AlignedCounts.set_totals(self, totals, sample_floor, now_ms)
            return
        first = self.part < 0  # never read: `totals` holds every retained sample
        own = self.since_read
        # The others' bytes `pace` took them to add meanwhile: none where the store keeps turns
        # (the others wait for theirs).
        guessed = 0.0 if self.home.turns is not None else self.ratio * own
        grew = self._read_growth(totals, sample_floor, now_ms)
        # The pace is made again from the read on: the others' new bytes in place of the guess,
        # each sample's paced as let in when the sample ended (or now, if later), then this
        # replica's own bytes since the last read. Every replica's pace then counts the fleet's
        # bytes. Read for the first time, the others' past samples are paced from the oldest,
        # so what is older than the credit is paid for by the time that passed.
        credit = self._pace_credit_ms()
        w, offset = self._aligned_window, self.clock.offset_ms
        at = -math.inf if first else self._admit_at - (own + guessed) * 1000.0 / bound
        for s in sorted(totals):
            new = grew[s]
            if new > 0:
                floor = min(now_ms, (s + 1) * w - offset) - credit
                if at < floor:
                    at = floor
                at += new * 1000.0 / bound
        if own:
            at = max(at, now_ms - credit) + own * 1000.0 / bound
        self._admit_at = at

    def measure(self, now_ms: float) -> float:
        own = Rate.measure(self, now_ms)
        degraded = self.degraded
        if degraded is not None:
            return own / degraded.share
        return own + self.others_rate(now_ms)

    def surely_within(self, bound: float, now_ms: float) -> bool:
        degraded = self.degraded
        if degraded is not None:
            bound *= degraded.share
        elif self._others_sum or self.ratio:
            # others_rate is at most their sum (and the predicted part) over (N-1) windows
            bound -= (self._others_sum + self.ratio * self.since_read) / self._min_window_s
        # Rate.surely_within, inlined: this runs on every charged request.
        oldest = self._oldest
        return (self._exact and now_ms < self._purge_due and oldest is not None and now_ms >= oldest
                and self._total <= bound * self._min_window_s)


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

    def __init__(self, config: MetricConfig, key: str, home: SharedQuotas,
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

    def __init__(self, config: MetricConfig, key: str, home: SharedQuotas,
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

    def __init__(self, rate_per_s: float, config: MetricConfig, key: str, home: SharedQuotas) -> None:
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
        # a sync whose store does; None, each replica takes its chance of a turn (admit_wait_ms).
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
