"""Kafka's controller mutation quota (KIP-599), clock injected: a token bucket per entity, strict
(CreateTopics and friends refused with THROTTLING_QUOTA_EXCEEDED over it) or permissive
(throttled only), as `ControllerMutationQuotaManager` and its quotas in Kafka."""

from __future__ import annotations

from typing import cast

from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.managers import ResolvedQuota, clamp_throttle
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.sensors import Sensors, StatFactory
from kafka_quota_proxy.quota.throttle import java_round, token_bucket_throttle_time_ms
from kafka_quota_proxy.quota.token_bucket import TokenBucket


class ControllerMutationQuota:
    """The mutation quota of one request (Kafka's ControllerMutationQuota), from
    `ControllerMutationQuotaManager.new_quota_for`. It remembers its last throttle so that the
    response, sent later, reports what is left of it. This base class is the unbounded quota used
    when no quota applies: it accepts everything and never throttles."""

    __slots__ = ("_last_throttle_ms", "_last_recorded_ms")

    def __init__(self) -> None:
        self._last_throttle_ms = 0
        self._last_recorded_ms: float = 0

    @property
    def is_exceeded(self) -> bool:
        return False

    def record(self, permits: float, now_ms: float) -> bool:
        """Charge `permits`; False if rejected (THROTTLING_QUOTA_EXCEEDED, strict only)."""
        return True

    def _update_throttle(self, tokens: float, rate_per_s: float, now_ms: float) -> None:
        self._last_throttle_ms = token_bucket_throttle_time_ms(tokens, rate_per_s)
        self._last_recorded_ms = now_ms

    def throttle_time_ms(self, now_ms: float) -> int:
        """The last throttle, less the time since it was computed: max(0, last - (now - then))."""
        return clamp_throttle(java_round(self._last_throttle_ms - (now_ms - self._last_recorded_ms)))


class StrictControllerMutationQuota(ControllerMutationQuota):
    """Strict (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+): rejects without
    recording once the bucket is below zero; otherwise records the full amount, however large."""

    __slots__ = ("_bucket",)

    def __init__(self, bucket: TokenBucket) -> None:
        super().__init__()
        self._bucket = bucket

    @property
    def is_exceeded(self) -> bool:
        return self._last_throttle_ms > 0

    def record(self, permits: float, now_ms: float) -> bool:
        bucket = self._bucket
        tokens = bucket.tokens(now_ms)
        if tokens < 0:
            self._update_throttle(tokens, bucket.rate_per_s, now_ms)
            return False
        bucket.record(permits, now_ms)
        return True


class PermissiveControllerMutationQuota(ControllerMutationQuota):
    """Permissive (older versions, auto topic creation): always records, throttles when below zero."""

    __slots__ = ("_bucket",)

    def __init__(self, bucket: TokenBucket) -> None:
        super().__init__()
        self._bucket = bucket

    def record(self, permits: float, now_ms: float) -> bool:
        bucket = self._bucket
        bucket.record(permits, now_ms)
        tokens = bucket.tokens(now_ms)
        if tokens < 0:
            self._update_throttle(tokens, bucket.rate_per_s, now_ms)
        return True


UNBOUNDED_CONTROLLER_MUTATION_QUOTA = ControllerMutationQuota()


class ControllerMutationQuotaManager(ResolvedQuota):
    """`controller_mutation_rate` (KIP-599): a token bucket per shared (user, client-id) sensor,
    refilled at the quota in partitions per second, with a burst of N * W * Q."""

    def __init__(self, store: QuotaStore, config: MetricConfig, sensors: Sensors,
                 stats: StatFactory | None = None) -> None:
        super().__init__(QuotaKey.CONTROLLER_MUTATION_RATE, store, config, sensors, stats)

    def _bucket(self, user: str, client_id: str | None, now_ms: float) -> TokenBucket | None:
        if not self.resolver.quotas_enabled:
            return None
        res = self.resolver.resolve(user, client_id)
        bound = res.quota
        if bound is None:
            return None  # Kafka's bound would be Long.MAX_VALUE: never below zero
        make = self.stats.bucket
        key = res.sensor_key
        bucket = self.sensors.get_or_create(key, now_ms, lambda: make(key, bound))
        if bucket is not None:
            bucket.rate_per_s = bound  # a changed quota applies from the next refill, as in Kafka
        return bucket

    def new_quota_for(self, user: str, client_id: str | None, strict: bool,
                      now_ms: float) -> ControllerMutationQuota:
        """The quota for one request: strict or permissive, or unbounded when no quota applies."""
        bucket = self._bucket(user, client_id, now_ms)
        if bucket is None:
            return UNBOUNDED_CONTROLLER_MUTATION_QUOTA
        return StrictControllerMutationQuota(bucket) if strict else PermissiveControllerMutationQuota(bucket)

    def record_strict(self, user: str, client_id: str | None, permits: float,
                      now_ms: float) -> tuple[bool, int]:
        """Check, then record all of `permits`: (accepted, throttle ms). Rejected means the bucket was
        already below zero; nothing is recorded then."""
        q = self.new_quota_for(user, client_id, True, now_ms)
        accepted = q.record(permits, now_ms)
        return accepted, q.throttle_time_ms(now_ms)

    def record_permissive(self, user: str, client_id: str | None, permits: float, now_ms: float) -> int:
        """Record `permits` and return the throttle (0 unless the bucket is below zero)."""
        q = self.new_quota_for(user, client_id, False, now_ms)
        q.record(permits, now_ms)
        return q.throttle_time_ms(now_ms)

    def tokens(self, user: str, client_id: str | None, now_ms: float) -> float | None:
        """The credits left on this client's bucket (the `tokens` metric), None if it has none."""
        res = self.resolver.resolve(user, client_id)
        stat = self.sensors.get(res.sensor_key, now_ms)
        return None if stat is None else cast(TokenBucket, stat).tokens(now_ms)
