"""A shared `Rate`: Kafka's `Rate` for this replica's own bytes plus the other replicas' bytes from
the store (quota/shared.py has the shape), and the throttles of Kafka's mode settled at the
store's reads (`Owed`). Pure: no I/O, no clock of its own."""

from __future__ import annotations

from typing import Protocol

from kafka_quota_proxy.quota.aligned import SLOTS, AlignedCounts, Home
from kafka_quota_proxy.quota.rate import MetricConfig, Rate


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


class ReadPacer(Protocol):
    """What a `SharedRate` tells its pacer (`shared_pacer.SharedPacer`): the store's reads, which
    make its pace again from the fleet's bytes."""

    def read(self, totals: dict[int, int], sample_floor: int, now_ms: float) -> None: ...


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

    __slots__ = SLOTS + ("owes", "settles", "reads", "pending", "pacer")

    first_bytes_span = True  # AlignedCounts.first_bytes_span

    def __init__(self, config: MetricConfig, key: str, home: Home) -> None:
        Rate.__init__(self, config)
        self._init_counts(config, key, home)
        # Kafka's throttles of this rate are settled at the reads (`owe`): a Produce quota's,
        # whose connection the proxy can hold for what is owed (QuotaCharge.hold_ms).
        self.owes = False
        self.settles = False  # owed lately, Kafka's mode: the others' bytes are not predicted
        self.reads = 0
        self.pending: list[Owed] = []  # requests the next two reads settle
        # `quota.byte_rate_enforcement: paced`: the pacer of this rate's bytes, kept here for as
        # long as the rate (a sensor made again finds it), since the reads re-make its pace.
        self.pacer: ReadPacer | None = None

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

    def set_totals(self, totals: dict[int, int], sample_floor: int, now_ms: float) -> None:
        if self.settles and self.degraded is None:
            self._reveal(totals, sample_floor, now_ms)
            return
        pacer = self.pacer
        if pacer is None or self.degraded is not None:
            AlignedCounts.set_totals(self, totals, sample_floor, now_ms)
            return
        pacer.read(totals, sample_floor, now_ms)  # the others' bytes, and the pace made again

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
