"""Rate (SampledStat 3.8+ / Rate.measure) and TokenBucket, with a plain integer clock."""

from __future__ import annotations

import random

import pytest

from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.token_bucket import TokenBucket


def test_metric_config_defaults_are_kafkas() -> None:
    config = MetricConfig()
    assert (config.samples, config.window_ms, config.window_s) == (11, 1000, 1.0)


@pytest.mark.parametrize("samples, window_ms", [(0, 1000), (11, 0), (-1, 1000), (11, -5), (True, 1000),
                                                (11, 1.5), (2.0, 1000)])
def test_metric_config_rejects_values_below_one_or_not_whole(samples: int, window_ms: int) -> None:
    with pytest.raises(ValueError):
        MetricConfig(samples=samples, window_ms=window_ms)


@pytest.mark.parametrize("samples, window_s", [(1, 1), (1, 11), (11, 1), (11, 11)])
def test_rate_with_no_prior_samples(samples: int, window_s: int) -> None:
    # RateTest.testRateWithNoPriorAvailableSamples: 50 recorded at 0, measured 1 ms before the
    # first window ends; the window counts N-1 assumed empty samples.
    window_ms = window_s * 1000
    rate = Rate(MetricConfig(samples=samples, window_ms=window_ms))
    rate.record(50.0, 0)
    now = window_ms - 1
    assert rate.window_size_ms(now) == now + (samples - 1) * window_ms
    assert rate.measure(now) == 50.0 / ((now + (samples - 1) * window_ms) / 1000)


def test_rate_no_prior_samples_reference_numbers() -> None:
    # Section 11.5: N=11 -> 50/10.999 s = 4.5459/s; N=1 -> 50/0.999 s = 50.05/s.
    r11 = Rate(MetricConfig(samples=11))
    r11.record(50, 0)
    assert r11.measure(999) == 50 / 10.999
    assert round(r11.measure(999), 4) == 4.5459
    r1 = Rate(MetricConfig(samples=1))
    r1.record(50, 0)
    assert r1.measure(999) == 50 / 0.999
    assert round(r1.measure(999), 2) == 50.05


def test_fresh_rate_window_is_n_minus_one_windows_and_at_least_1ms() -> None:
    rate = Rate(MetricConfig())
    rate.record(5000, 0)
    assert rate.window_size_ms(0) == 10_000
    assert rate.measure(0) == 500.0
    one = Rate(MetricConfig(samples=1))
    one.record(7, 0)
    assert one.window_size_ms(0) == 1  # max(elapsed, 1) since Kafka 3.4
    assert one.measure(0) == 7000.0


def test_measure_of_a_rate_never_recorded_is_zero() -> None:
    rate = Rate(MetricConfig())
    assert rate.measure(123) == 0.0
    assert rate.total(123) == 0.0


def _complete_sample(rate: Rate, start: int) -> int:
    # SampledStatTest.completeSample: events at the start and at the end of one window.
    rate.record(1, start)
    rate.record(1, start + 999)
    return start + 1000


def test_sample_is_purged_if_it_does_not_overlap_the_window() -> None:
    rate = Rate(MetricConfig(samples=2, window_ms=1000))
    now = _complete_sample(rate, 0)
    assert rate.total(now + 2500) == 0.0  # last event 999, 3500 - 999 >= 2 * 1000


def test_sample_is_kept_if_it_overlaps_the_window() -> None:
    rate = Rate(MetricConfig(samples=2, window_ms=1000))
    now = _complete_sample(rate, 0)
    assert rate.total(now + 1500) == 2.0  # 2500 - 999 < 2000: the sample overlaps, kept whole


def test_n_plus_one_samples_are_kept() -> None:
    # SampledStatTest.testSampleIsKeptIfOverlapsAndExtra: two samples, then an event at 2.2 s.
    rate = Rate(MetricConfig(samples=2, window_ms=1000))
    now = _complete_sample(rate, 0)
    now = _complete_sample(rate, now + 100)  # sample 2: events at 1100 and 2099
    rate.record(1, now + 100)  # 2200: a third sample, in the extra slot
    assert rate.total(2200) == 5.0
    # The oldest sample (start 0) still counts: with only N slots it would start at 1100.
    assert rate.window_size_ms(2200) == 2200


def test_purge_is_by_last_event_at_exactly_n_windows() -> None:
    rate = Rate(MetricConfig(samples=2, window_ms=1000))
    rate.record(3, 0)
    assert rate.total(1999) == 3.0
    assert rate.total(2000) == 0.0


def test_samples_start_at_the_event_and_the_ring_reuses_the_oldest_slot() -> None:
    rate = Rate(MetricConfig(samples=2, window_ms=1000))
    rate.record(1, 500)  # slot 0 starts at 500, not at 0
    rate.record(1, 1499)  # still slot 0: 1499 - 500 < 1000
    assert rate.window_size_ms(1499) == 1999  # 999 elapsed, padded to N-1 = 1 full window
    rate.record(1, 1500)  # slot 1 starts at 1500
    rate.record(1, 2000)
    rate.record(1, 2500)  # slot 2, the extra one
    assert rate.total(2500) == 5.0
    assert rate.window_size_ms(2500) == 2000  # oldest start 500
    rate.record(1, 3500)  # the ring comes back to slot 0, reset to start at 3500
    assert rate.total(3500) == 4.0  # slot 0's two events are gone
    assert rate.window_size_ms(3500) == 2000  # oldest start is now 1500


def test_rate_is_consistent_after_the_first_window() -> None:
    # RateTest.testRateIsConsistentAfterTheFirstWindow, with the exact values: N=2, W=1 s, events
    # at 0, 99, 199 .. 999, a 101 ms gap, then the same again from 1100; the first window's 11
    # events stay in the overlapping sample, and the oldest sample starts at 0.
    rate = Rate(MetricConfig(samples=2, window_ms=1000))
    offsets = [0, 99, 199, 299, 399, 499, 599, 699, 799, 899, 999]
    for off in offsets:
        rate.record(1, off)
    for k, off in enumerate(offsets, start=1):
        now = 1100 + off
        rate.record(1, now)
        expected = (11 + k) / (now / 1000)
        assert rate.measure(now) == expected
        assert rate.measure(now) == expected  # repeatable at the same timestamp


def test_measure_at_the_exact_start_uses_the_padded_window() -> None:
    rate = Rate(MetricConfig(samples=11))
    rate.record(100, 10_000)
    assert rate.measure(10_000) == 10.0  # 100 over (N-1) * W = 10 s
    assert rate.measure(10_500) == 100 / 10.5


def test_the_running_sum_is_kept_only_while_it_is_exact() -> None:
    whole = Rate(MetricConfig(samples=2, window_ms=1000))
    for t, v in ((0, 1024), (1000, -512), (1500, 7.0)):
        whole.record(v, t)
    assert whole._exact and whole.total(1500) == 1024 - 512 + 7.0
    huge = Rate(MetricConfig(samples=2, window_ms=1000))
    huge.record(2.0**53 - 2, 0)
    assert huge._exact
    huge.record(3, 1000)  # 2**53 + 1 is not a float: from here on the samples are summed
    assert not huge._exact and huge.total(1000) == (2.0**53 - 2) + 3.0
    fractional = Rate(MetricConfig(samples=2, window_ms=1000))
    fractional.record(1, 0)
    fractional.record(0.5, 10)  # a request-time percentage
    assert not fractional._exact and fractional.total(10) == 1.5


def test_negative_record_unrecords() -> None:
    rate = Rate(MetricConfig())
    rate.record(1000, 0)
    rate.record(6000, 500)
    rate.record(-6000, 500)
    assert rate.total(500) == 1000.0
    assert rate.measure(500) == 1000 / 10.5


class _PlainRate:
    """Kafka's SampledStat and Rate.measure written out with no shortcuts: every measure purges
    by scanning all samples and finds the oldest start by scanning again."""

    def __init__(self, samples: int, window_ms: int) -> None:
        self.n, self.w = samples, window_ms
        self.samples: list[list[float]] = []  # [start, last, value]
        self.current = 0

    def record(self, value: float, now: float) -> None:
        if not self.samples:
            self.samples.append([now, now, 0.0])
        sample = self.samples[self.current]
        if now - sample[0] >= self.w:
            self.current = (self.current + 1) % (self.n + 1)
            if self.current >= len(self.samples):
                self.samples.append([now, now, 0.0])
            else:
                self.samples[self.current][:] = [now, now, 0.0]
            sample = self.samples[self.current]
        sample[2] += value
        sample[1] = now

    def measure(self, now: float) -> float:
        if not self.samples:
            self.samples.append([now, now, 0.0])
        for sample in self.samples:
            if now - sample[1] >= self.n * self.w:
                sample[:] = [now, now, 0.0]
        total = 0.0
        for sample in self.samples:
            total += sample[2]
        elapsed = now - min(sample[0] for sample in self.samples)
        full = int(elapsed // self.w) if elapsed >= 0 else -int(-elapsed // self.w)
        if full < self.n - 1:
            elapsed += (self.n - 1 - full) * self.w
        return total / (max(elapsed, 1) / 1000.0)


@pytest.mark.parametrize("values", ["fractional", "whole", "mixed"])
@pytest.mark.parametrize("seed", range(20))
def test_rate_measures_exactly_as_the_plain_algorithm(seed: int, values: str) -> None:
    """`Rate` keeps caches (when a purge can next be due, the oldest start, and the running sum
    while every value is whole) so that a measure need not scan the ring; over random records,
    quiet gaps long enough to expire samples, and the clock going back, every measure equals
    the plain algorithm's to the bit. Byte counts are whole; request-time percentages are not;
    "mixed" turns fractional part-way through."""
    rnd = random.Random(seed)
    samples, window = rnd.choice([(11, 1000), (3, 1000), (2, 500), (1, 1000)])
    rate, plain = Rate(MetricConfig(samples=samples, window_ms=window)), _PlainRate(samples, window)
    now = float(rnd.randrange(0, 5000))
    surely = [0]
    for _ in range(3000):
        step = rnd.random()
        if step < 0.02:
            now -= rnd.randrange(1, 3 * window)  # the clock went back
        elif step < 0.05:
            now += rnd.randrange(samples * window, (samples + 2) * window)  # a quiet gap
        else:
            now += rnd.randrange(0, window // 2)
        if rnd.random() < 0.7:
            value = float(rnd.choice([1, 1024, 65536])) * rnd.choice([1, 1, 1, -1])
            if values == "fractional" or (values == "mixed" and rnd.random() < 0.01):
                value += rnd.random()
            rate.record(value, now)
            plain.record(value, now)
        # Whatever it says "surely within" of is within, for bounds on both sides of the rate.
        measured = plain.measure(now)
        for bound in (0.0, abs(measured) * 0.999, abs(measured), abs(measured) * 1.001, 1e9):
            if rate.surely_within(bound, now):
                assert measured <= bound
                surely[0] += 1
        assert rate.measure(now) == measured
    if values == "whole":
        assert surely[0] > 0  # the shortcut was taken, and never wrongly
    elif values == "fractional":
        assert surely[0] == 0  # no exact running sum: always measured


def test_rate_so_far_is_over_the_time_the_samples_span_not_the_padded_window() -> None:
    rate = Rate(MetricConfig())  # N = 11, W = 1 s
    assert rate.rate_so_far(0) == 0.0  # never recorded
    rate.record(4000, 0)
    # A young sensor's first burst: Kafka's rate divides by (N-1) W = 10 s; so far, by one W.
    assert rate.measure(0) == 400.0
    assert rate.rate_so_far(0) == 4000.0
    assert rate.rate_so_far(500) == 4000.0  # at least one sample's W
    rate.record(2000, 2000)
    assert rate.rate_so_far(3000) == 2000.0  # 6000 B over the 3 s since the first sample began
    assert rate.measure(3000) == 600.0
    # Once the samples span (N-1) W or more, the two agree: at 12 s the first sample (11 s
    # old) is reset, and 2900 B are left over the 10 s since the second began.
    for t in range(3000, 12_000, 1000):
        rate.record(100, t)
    assert rate.rate_so_far(12_000) == rate.measure(12_000) == 290.0
    # Samples that ran out are reset: an idle sensor's rate so far is nothing.
    assert rate.rate_so_far(40_000) == 0.0


@pytest.mark.parametrize(("bound", "over"), [(3999.0, True), (4000.0, False), (5000.0, False)])
def test_over_so_far_is_rate_so_far_above_the_bound(bound: float, over: bool) -> None:
    rate = Rate(MetricConfig())
    rate.record(4000, 0)
    assert rate.over_so_far(bound, 0) is over is (rate.rate_so_far(0) > bound)
    rate.record(0.5, 0)  # a fractional value: no exact running sum, so no shortcut
    assert rate.over_so_far(4000.0, 0) is True


# TokenBucket (TokenBucketTest): Q = 5/s, N = 10, W = 2 s -> B = 100.

def _bucket() -> TokenBucket:
    return TokenBucket(5, MetricConfig(samples=10, window_ms=2000))


def test_token_bucket_burst_is_n_w_q() -> None:
    assert _bucket().burst == 100.0
    assert TokenBucket(10, MetricConfig(samples=10, window_ms=1000)).burst == 100.0


def test_token_bucket_starts_full_whatever_the_clock() -> None:
    assert _bucket().tokens(0) == 100.0
    assert _bucket().tokens(1_700_000_000_000) == 100.0


def test_token_bucket_record() -> None:
    tk = _bucket()
    assert tk.tokens(0) == 100.0
    tk.record(60, 0)
    assert tk.tokens(0) == 40.0
    tk.record(5, 2000)
    assert tk.tokens(2000) == 45.0
    tk.record(60, 4000)
    assert tk.tokens(4000) == -5.0


def test_token_bucket_unrecord_is_capped_at_burst() -> None:
    tk = _bucket()
    assert tk.tokens(0) == 100.0
    tk.record(-60, 0)
    assert tk.tokens(0) == 100.0
    tk.record(60, 2000)
    assert tk.tokens(2000) == 40.0
    tk.record(-60, 4000)
    assert tk.tokens(4000) == 100.0


def test_token_bucket_refills_at_the_new_rate_after_a_quota_change() -> None:
    tk = TokenBucket(10, MetricConfig(samples=10, window_ms=1000))
    tk.record(150, 0)
    assert tk.tokens(0) == -50.0
    tk.rate_per_s = 20  # Kafka updates the live sensor's quota
    assert tk.tokens(1000) == -30.0
    assert tk.burst == 200.0
