"""Kafka's TokenBucket stat (KIP-599), used by the controller mutation quota."""

from __future__ import annotations

from kafka_quota_proxy.quota.rate import MetricConfig


class TokenBucket:
    """Credits refilled continuously at the quota Q per second, up to a burst B = N * W * Q.

    The quota is violated when the credits are below zero. Recording may drive them far below zero
    (a strict caller checks before recording). `rate_per_s` is public and may change: Kafka updates
    a live sensor's quota in place, and the next refill then runs at the new rate.
    """

    __slots__ = ("rate_per_s", "config", "_tokens", "_last_update_ms")

    def __init__(self, rate_per_s: float, config: MetricConfig) -> None:
        self.rate_per_s = rate_per_s
        self.config = config
        self._tokens = 0.0
        # Kafka starts at lastUpdateMs=0, so its first refill (with an epoch clock) clamps to B.
        # None keeps that "starts full" meaning for any clock origin, a fake clock at 0 included.
        self._last_update_ms: float | None = None

    @property
    def burst(self) -> float:
        return self.config.samples * self.config.window_s * self.rate_per_s

    def _refill(self, now_ms: float) -> float:
        burst = self.burst
        if self._last_update_ms is None:
            self._tokens = burst
        else:
            elapsed_s = (now_ms - self._last_update_ms) / 1000.0
            self._tokens = min(burst, self._tokens + self.rate_per_s * elapsed_s)
        self._last_update_ms = now_ms
        return burst

    def record(self, value: float, now_ms: float) -> None:
        """Refill up to `now_ms`, then take `value` credits."""
        burst = self._refill(now_ms)
        self._tokens = min(burst, self._tokens - value)

    def tokens(self, now_ms: float) -> float:
        """The credits at `now_ms`, after refilling (TokenBucket.measure)."""
        self._refill(now_ms)
        return self._tokens

    def __repr__(self) -> str:
        return (f"TokenBucket(rate_per_s={self.rate_per_s}, tokens={self._tokens}, "
                f"last_update_ms={self._last_update_ms})")
