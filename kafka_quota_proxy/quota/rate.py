"""Kafka's windowed rate: `MetricConfig`, and `Rate` over a `WindowedSum` (SampledStat, 3.8+).

Time is passed in: every method takes `now_ms`. Nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MetricConfig:
    """The sample layout of a quota sensor: `quota.window.num` samples of `quota.window.size.seconds`.

    Kafka's defaults are 11 samples of 1 s. Both must be at least 1, as Kafka's config checks.
    """

    samples: int = 11
    window_ms: int = 1000

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"samples must be a whole number >= 1, got {self.samples!r}")
        if isinstance(self.window_ms, bool) or not isinstance(self.window_ms, int) or self.window_ms < 1:
            raise ValueError(f"window_ms must be a whole number >= 1, got {self.window_ms!r}")

    @property
    def window_s(self) -> float:
        return self.window_ms / 1000.0


_EXACT = float(2**53)  # below this every whole number is a float, and sums of them are exact


def _trunc_div(a: float, b: int) -> int:
    # Java's long division truncates toward zero; it only matters if the clock went backwards.
    return int(a // b) if a >= 0 else -int(-a // b)


class Rate:
    """A per-second rate over a ring of samples, exactly as Kafka's `Rate(SECONDS, WindowedSum)`.

    The ring has N+1 slots: the extra one holds the sample that overlaps the start of the monitored
    N*W window (Kafka 3.8, "Fix rate metric spikes"). A sample starts at the time of the event that
    opens it, not on a wall-clock boundary. Slots are created lazily, as Kafka's ArrayList grows, so
    slots never used do not count as "oldest".
    """

    owes = False  # SharedRate: Kafka's throttles settled at the store's reads (`SharedRate.owe`)

    __slots__ = ("config", "_slots", "_window", "_expire_age", "_min_full", "_current",
                 "_starts", "_lasts", "_values", "_purge_due", "_oldest", "_total", "_exact",
                 "_min_window_s", "_paced_until", "_admit_at", "_pace_bound")

    def __init__(self, config: MetricConfig) -> None:
        self.config = config
        self._slots = config.samples + 1
        self._window = config.window_ms
        self._expire_age = config.samples * config.window_ms
        self._min_full = config.samples - 1
        self._current = 0
        # Parallel lists rather than Sample objects: no allocation per record once the ring is full.
        self._starts: list[float] = []
        self._lasts: list[float] = []
        self._values: list[float] = []
        # `measure` runs on every charged request, while samples open or reset about once per W;
        # two caches spare it a scan of the ring each time. No sample can be due for a reset
        # before `_purge_due` (min(lasts) + N*W, or earlier: a `last` only ever moves later,
        # unless the clock goes back, which lowers the bound as it happens). `_oldest` is
        # min(starts), or None once a start has changed and it must be found again.
        self._purge_due = float("inf")
        self._oldest: float | None = None
        # The sum of `_values`, kept as they change, while `_exact`: every value recorded is a
        # whole number and the running sum stays below 2**53, so each addition and subtraction
        # is exact and the sum equals Kafka's left-to-right one to the bit. Byte counts always
        # are; request-time percentages are not, and such a Rate sums its samples every time.
        self._total = 0.0
        self._exact = True
        # The shortest window `measure` divides by while the clock is not behind the oldest
        # sample, (N-1) * W, in seconds, less a millionth for rounding (see `surely_within`).
        self._min_window_s = self._min_full * self._window / 1000.0 * (1 - 1e-6)
        # Where `pace_ms` has spaced this sensor's deliveries out to (see there).
        self._paced_until = -float("inf")
        # `quota.byte_rate_enforcement: paced` (`pace`): when the bytes let in so far are paid for
        # at the quota, and the quota they were last paced at (None: never paced).
        self._admit_at = -float("inf")
        self._pace_bound: float | None = None

    def _new_sample(self, now_ms: float) -> None:
        self._starts.append(now_ms)
        self._lasts.append(now_ms)
        self._values.append(0.0)
        due = now_ms + self._expire_age
        if due < self._purge_due:
            self._purge_due = due
        if self._oldest is not None and now_ms < self._oldest:
            self._oldest = now_ms

    def record(self, value: float, now_ms: float) -> None:
        """Add `value` at `now_ms`, opening the next sample if the current one is W old."""
        starts = self._starts
        if not starts:
            self._new_sample(now_ms)
        cur = self._current
        if now_ms - starts[cur] >= self._window:
            cur = (cur + 1) % self._slots
            self._current = cur
            if cur >= len(starts):
                self._new_sample(now_ms)
            else:
                starts[cur] = now_ms
                self._lasts[cur] = now_ms
                self._total -= self._values[cur]
                self._values[cur] = 0.0
                self._oldest = None
        self._values[cur] += value
        if self._exact:
            total = self._total + value
            if value % 1 or not -_EXACT < total < _EXACT:
                self._exact = False
            self._total = total
        self._lasts[cur] = now_ms
        if now_ms + self._expire_age < self._purge_due:
            self._purge_due = now_ms + self._expire_age  # the clock went back

    def _purge(self, now_ms: float) -> None:
        # A sample with no event in the last N*W is reset (not removed), and restarts at `now`.
        if now_ms < self._purge_due:
            return
        lasts = self._lasts
        age = self._expire_age
        for i in range(len(lasts)):
            if now_ms - lasts[i] >= age:
                self._starts[i] = now_ms
                lasts[i] = now_ms
                self._total -= self._values[i]
                self._values[i] = 0.0
                self._oldest = None
        self._purge_due = min(lasts) + age if lasts else float("inf")

    def _oldest_start(self) -> float:
        oldest = self._oldest
        if oldest is None:
            oldest = self._oldest = min(self._starts)
        return oldest

    def _sum(self) -> float:
        if self._exact:
            return self._total
        # A plain left-to-right sum as Java's WindowedSum; Python 3.12's sum() compensates, which
        # could differ from Kafka in the last bit.
        total = 0.0
        for v in self._values:
            total += v
        return total

    def total(self, now_ms: float) -> float:
        """The sum of the retained samples (Kafka's WindowedSum.measure)."""
        self._purge(now_ms)
        return self._sum()

    def window_size_ms(self, now_ms: float) -> float:
        """The window the rate is divided by (Rate.windowSize): the time since the oldest sample,
        but at least N-1 full windows, and at least 1 ms."""
        self._purge(now_ms)
        return self._window_size_after_purge(now_ms)

    def _window_size_after_purge(self, now_ms: float) -> float:
        if not self._starts:
            # Kafka's oldest() creates the first sample here, at `now`; later records land in it.
            self._new_sample(now_ms)
        oldest = self._oldest
        if oldest is None:
            oldest = self._oldest_start()
        elapsed = now_ms - oldest
        full = int(elapsed // self._window) if elapsed >= 0 else _trunc_div(elapsed, self._window)
        if full < self._min_full:
            elapsed += (self._min_full - full) * self._window
        return float(max(elapsed, 1))

    def surely_within(self, bound: float, now_ms: float) -> bool:
        """True when `measure(now_ms)` cannot be above `bound`, known without measuring: no
        sample is due for a purge, the running sum is exact, and the clock is not behind the
        oldest sample, so the window is at least (N-1) * W and the rate at most the sum over
        that. False means only "measure to know". A quota manager asks this first: clients far
        below their quota, the usual case, then skip the measure (which has nothing to change
        then: no purge, no sample to create)."""
        oldest = self._oldest
        return (self._exact and now_ms < self._purge_due and oldest is not None and now_ms >= oldest
                and self._total <= bound * self._min_window_s)

    def judge_fetch(self, now_ms: float, size: float, measured: float,
                    bound: float) -> tuple[float, int | None]:
        """A fetch of `size` just recorded measured `measured`, over `bound`: Kafka's rule
        refuses it and throttles by that rate, (measured, None). A rate shared with other replicas
        may decide otherwise (`SharedRate.judge_fetch`)."""
        return measured, None

    def takes_turns(self) -> bool:
        """Whether a fetch of this rate takes turns with other replicas (`SharedFetchRate`)."""
        return False

    def quota_share(self) -> float:
        """The part of the quota this stat's own bytes may pace at: all of it here. A rate shared
        with other replicas paces at its part of the fleet's bytes (`SharedRate.quota_share`)."""
        return 1.0

    def pace_ms(self, size: float, bound: float, now_ms: float) -> float:
        """How long to hold the client after delivering `size` bytes over the quota `bound`, so
        that what it is delivered while over comes no faster than the quota: each delivery is
        spaced `size / bound` after the previous one, for all of this sensor's connections
        together. Not Kafka's: a broker never delivers a fetch over quota (see `quota.
        share_fetch_throttle` in docs/quotas.md for why the proxy delivers a ShareFetch's). A
        delivery up to one sample window (W) after its paced time is spaced from that time, not
        from `now_ms`, so that the client's own round trips do not slow it below the quota (from
        now, a consumer paced at 256 KiB/s read 0.95 of it); later than that, the pace restarts."""
        paced = self._paced_until
        start = paced if now_ms - paced < self._window else now_ms
        self._paced_until = start + size * 1000.0 / (bound * self.quota_share())
        return self._paced_until - now_ms

    def paced_wait_ms(self, now_ms: float) -> float:
        """(`quota.byte_rate_enforcement: paced`) How long until this sensor's next bytes may be
        let in: until the bytes `pace` let in so far are paid for at the quota (<= 0: now)."""
        return self._admit_at - now_ms

    def admit_wait_ms(self, now_ms: float) -> float:
        """`paced_wait_ms` for a request about to be let in (read off a connection): the same
        here; with the quota shared, maybe a little longer (`SharedRate.admit_wait_ms`)."""
        return self._admit_at - now_ms

    def paced_at(self, bound: float) -> None:
        """(`quota.byte_rate_enforcement: paced`) The quota this stat's bytes are paced at, told
        before the first `pace`: a rate shared with other replicas then paces the others' bytes
        it reads from the first read on (`SharedRate.set_totals`), not from its own first bytes."""
        self._pace_bound = bound

    def pace(self, size: float, bound: float, now_ms: float) -> float:
        """(`quota.byte_rate_enforcement: paced`) Let `size` bytes in at `now_ms`: they are paid
        for `size / bound` after the later of the paced time and `now_ms` less the credit a
        client builds up while below its quota, at most (N-1) W of it, Kafka's first allowance
        (a fresh window of Kafka's Rate takes (N-1) W of quota before it throttles). After that
        a flat-out client is let in at the quota, whatever its number of connections. A virtual
        scheduling (GCRA) token bucket, not Kafka's Rate. Returns when the next bytes may come
        at the earliest (SharedRate: later, if the others send meanwhile)."""
        self._pace_bound = bound
        start = self._admit_at
        floor = now_ms - self._pace_credit_ms()
        if start < floor:
            start = floor
        paid = size * 1000.0 / bound
        part = self._pace_part()
        if part == 1.0:
            self._admit_at = start + paid
            return self._admit_at
        # Shared with other replicas, its own bytes are paced at its part of the quota until the
        # next read shows the others' (SharedRate.set_totals). The client is told (and muted
        # for) its turn by that guess less the credit, so that it is back in time for the turn
        # when the others sent less; the pace holds it until then. (Muted for the whole guess,
        # 10 replicas of one 1 MB producer each got 0.93 of the quota in bench.many_connections_sim;
        # for its own bytes alone, they all waited for each turn and took it together: 1.36x.)
        self._admit_at = start + paid / part
        return max(start + paid, self._admit_at - self._pace_credit_ms())

    def _pace_credit_ms(self) -> float:
        return float(self._min_full * self._window)

    def _pace_part(self) -> float:
        """The part of the quota this stat's own bytes are paced at: all of it (see SharedRate)."""
        return 1.0

    def measure(self, now_ms: float) -> float:
        """The rate per second at `now_ms` (Rate.measure): purge, sum, divide by the window."""
        # Every charged request measures: the checks that usually find nothing to do are made
        # here rather than in the calls they would skip.
        if now_ms >= self._purge_due:
            self._purge(now_ms)
        return self._sum() / (self._window_size_after_purge(now_ms) / 1000.0)

    def rate_so_far(self, now_ms: float) -> float:
        """The rate per second over the time the retained samples actually span, at least one
        sample (W). Not Kafka's: `measure` pads a young sensor's window to (N-1) samples, which
        lets a client's first (N-1) * W of quota through at once; this shows that first burst
        as the rate it came at. 0.0 for a sensor that never recorded."""
        if not self._starts:
            return 0.0
        if now_ms >= self._purge_due:
            self._purge(now_ms)
        span = now_ms - self._oldest_start()
        return self._sum() * 1000.0 / (span if span > self._window else self._window)

    def over_so_far(self, bound: float, now_ms: float) -> bool:
        """Whether `rate_so_far(now_ms)` is above `bound`; known without measuring while the
        retained sum is within one sample's worth of it (a purge only lowers the sum, and the
        span is at least one sample), as it is for a client far below its quota."""
        if self._exact and self._total * 1000.0 <= bound * self._window:
            return False
        return self.rate_so_far(now_ms) > bound

    def __repr__(self) -> str:
        return (f"Rate(samples={self.config.samples}, window_ms={self.config.window_ms}, "
                f"starts={self._starts}, values={self._values})")
