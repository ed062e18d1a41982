"""Throttle times, as Kafka's QuotaUtils and ControllerMutationQuotaManager compute them.

All of these may be negative when the client is under its quota, as in Kafka; callers clamp at 0.
"""

from __future__ import annotations

import math

from kafka_quota_proxy.quota.rate import Rate

LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
INT_MAX = 2**31 - 1


def java_round(x: float) -> int:
    """Java's `Math.round(double)`: floor(x + 0.5) computed exactly, NaN -> 0, clamped to a long.

    Python's round() rounds half to even, and floor(x + 0.5) in floating point rounds
    0.49999999999999994 up; both differ from Java.
    """
    if x != x:
        return 0
    if x >= LONG_MAX:
        return LONG_MAX
    if x <= LONG_MIN:
        return LONG_MIN
    fl = math.floor(x)
    # x - floor(x) is exact for a double, so this is floor(x + 0.5) without an addition's rounding.
    return fl + 1 if x - fl >= 0.5 else fl


def _ieee_div(a: float, b: float) -> float:
    # Java divides by zero into an infinity (or NaN); Python raises. A zero bound is reachable for
    # connection_creation_rate, whose throttle Kafka then caps.
    if b == 0:
        if a == 0 or a != a:
            return math.nan
        return math.inf if (a > 0) == (math.copysign(1.0, b) > 0) else -math.inf
    return a / b


def throttle_time_ms(measured: float, bound: float, window_ms: float) -> int:
    """QuotaUtils.throttleTime: the delay X that brings O over W down to T, O*W/(W+X) = T,
    so X = (O - T)/T * W, rounded as Java does. Negative when O < T."""
    return java_round(_ieee_div(measured - bound, bound) * window_ms)


def bounded_throttle_time_ms(measured: float, bound: float, window_ms: float, max_ms: int) -> int:
    """QuotaUtils.boundedThrottleTime: `throttle_time_ms` capped at `max_ms`."""
    return min(throttle_time_ms(measured, bound, window_ms), max_ms)


def rate_throttle_time_ms(stat: Rate, measured: float, bound: float, now_ms: float,
                          max_ms: int | None = None) -> int:
    """QuotaUtils.throttleTime(e, now) for a violation of `stat`: the window is the one the rate was
    measured over, recomputed at `now_ms`. Only a `Rate` has such a window (Kafka throws
    IllegalArgumentException; here TypeError)."""
    if not isinstance(stat, Rate):
        raise TypeError(f"{stat!r} is not a Rate metric")
    window = stat.window_size_ms(now_ms)
    if max_ms is None:
        return throttle_time_ms(measured, bound, window)
    return bounded_throttle_time_ms(measured, bound, window, max_ms)


def token_bucket_throttle_time_ms(tokens: float, rate_per_s: float) -> int:
    """ControllerMutationQuotaManager.throttleTimeMs: the time for a bucket at `tokens` to refill
    to zero at `rate_per_s`, round(-tokens / Q * 1000). Not bounded."""
    return java_round(_ieee_div(-tokens, rate_per_s) * 1000)
