"""A shared stat's counts per aligned sample: this replica's own and the other replicas' as the
store's last read gave them (quota/shared.py has the shape). Pure: no I/O, no clock of its own."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Protocol

from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.turns import Turns


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


class Home(Protocol):
    """The registry a shared stat belongs to (`SharedQuotas`), as its stats see it."""

    clock: StoreClock
    live_replicas: int  # replicas with a recent heartbeat, this one included
    read_every_ms: float  # the sync's interval
    read_ms: float  # the `now_ms` of the last read
    rng: random.Random
    turns: Turns | None

    def relist(self, stat: Any) -> None: ...
    def until_next_read_ms(self, now_ms: float) -> int: ...


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
    home: Home  # the registry the sync reads
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

    def _init_counts(self, config: MetricConfig, key: str, home: Home) -> None:
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
