"""Throttle times: QuotaUtils (QuotaUtilsTest), Java rounding, and the token-bucket formula."""

from __future__ import annotations

import math

import pytest

from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.throttle import (
    LONG_MAX,
    LONG_MIN,
    bounded_throttle_time_ms,
    java_round,
    rate_throttle_time_ms,
    throttle_time_ms,
    token_bucket_throttle_time_ms,
)
from kafka_quota_proxy.quota.token_bucket import TokenBucket

MAX_THROTTLE_MS = 500


def fresh_rate(samples: int) -> Rate:
    # QuotaUtilsTest's metric: a Rate with no samples, so its window is (N-1) * 1 s.
    return Rate(MetricConfig(samples=samples, window_ms=1000))


@pytest.mark.parametrize("x, expected", [
    (0.5, 1), (-0.5, 0), (2.5, 3), (-2.5, -2), (1.4999999999999998, 1), (0.49999999999999994, 0),
    (-0.49999999999999994, 0), (1666.6666666666667, 1667), (-1720.5882352941176, -1721),
    (2.0**53, 2**53), (math.nan, 0), (math.inf, LONG_MAX), (-math.inf, LONG_MIN), (1e300, LONG_MAX),
    (-1e300, LONG_MIN),
])
def test_java_round(x: float, expected: int) -> None:
    assert java_round(x) == expected


def test_throttle_time_observed_rate_above_quota() -> None:
    assert rate_throttle_time_ms(fresh_rate(3), 100.0, 50.0, 0) == 2000


def test_throttle_time_observed_rate_equals_quota() -> None:
    assert rate_throttle_time_ms(fresh_rate(10), 16.5, 16.5, 0) == 0
    assert rate_throttle_time_ms(fresh_rate(11), 16.5, 16.5, 0) == 0


def test_throttle_time_observed_rate_below_quota_is_negative() -> None:
    # (16.5 - 20.4) / 20.4 * 9000 = -1720.588..., (.. ) * 10000 = -1911.764...
    assert rate_throttle_time_ms(fresh_rate(10), 16.5, 20.4, 0) == -1721
    assert rate_throttle_time_ms(fresh_rate(11), 16.5, 20.4, 0) == -1912


def test_bounded_throttle_time_observed_rate_equals_quota() -> None:
    assert rate_throttle_time_ms(fresh_rate(10), 18.2, 18.2, 0, MAX_THROTTLE_MS) == 0
    assert rate_throttle_time_ms(fresh_rate(11), 18.2, 18.2, 0, MAX_THROTTLE_MS) == 0


def test_bounded_throttle_time_observed_rate_below_quota_is_negative() -> None:
    # (16.5 - 22.4) / 22.4 * 9000 = -2370.535..., * 10000 = -2633.928...
    assert rate_throttle_time_ms(fresh_rate(10), 16.5, 22.4, 0, MAX_THROTTLE_MS) == -2371
    assert rate_throttle_time_ms(fresh_rate(11), 16.5, 22.4, 0, MAX_THROTTLE_MS) == -2634


def test_bounded_throttle_time_above_quota_below_limit() -> None:
    assert rate_throttle_time_ms(fresh_rate(2), 55.0, 50.0, 0, MAX_THROTTLE_MS) == 100


def test_bounded_throttle_time_above_quota_above_limit() -> None:
    # Unbounded this would be (100 - 50) / 50 * 9000 = 9000.
    assert rate_throttle_time_ms(fresh_rate(10), 100.0, 50.0, 0) == 9000
    assert rate_throttle_time_ms(fresh_rate(10), 100.0, 50.0, 0, MAX_THROTTLE_MS) == 500


def test_throttle_time_needs_a_rate_metric() -> None:
    bucket = TokenBucket(10, MetricConfig())
    with pytest.raises(TypeError):
        rate_throttle_time_ms(bucket, 10.0, 20.0, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rate_throttle_time_ms(bucket, 10.0, 20.0, 0, MAX_THROTTLE_MS)  # type: ignore[arg-type]


def test_throttle_time_formula() -> None:
    # Section 11.1: 6000 B over a fresh 10 s window is 600 B/s against 500 -> 2000 ms.
    assert throttle_time_ms(600.0, 500.0, 10_000) == 2000
    assert throttle_time_ms(500.0, 500.0, 10_000) == 0
    assert throttle_time_ms(400.0, 500.0, 10_000) == -2000
    assert bounded_throttle_time_ms(600.0, 500.0, 10_000, 1000) == 1000
    assert bounded_throttle_time_ms(400.0, 500.0, 10_000, 1000) == -2000


def test_throttle_time_with_a_zero_bound_is_infinite_then_capped() -> None:
    # Java divides by zero into +Infinity; Math.round makes it Long.MAX_VALUE; the cap applies.
    assert throttle_time_ms(1.0, 0.0, 1000) == LONG_MAX
    assert bounded_throttle_time_ms(1.0, 0.0, 1000, 1000) == 1000
    assert throttle_time_ms(0.0, 0.0, 1000) == 0  # NaN rounds to 0


def test_token_bucket_throttle_time() -> None:
    # ControllerMutationQuotaManagerTest.testThrottleTime
    assert token_bucket_throttle_time_ms(0, 10) == 0
    assert token_bucket_throttle_time_ms(-5, 10) == 500
    assert token_bucket_throttle_time_ms(-10, 10) == 1000
    assert token_bucket_throttle_time_ms(-80, 10) == 8000
    assert token_bucket_throttle_time_ms(5, 10) == -500
