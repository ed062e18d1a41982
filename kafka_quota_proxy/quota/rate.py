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
                 "_min_window_s")

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
