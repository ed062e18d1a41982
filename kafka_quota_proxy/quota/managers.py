"""Kafka's quota managers, clock injected: byte rate (Produce, Fetch) and request time; controller
mutations in mutations.py, the per-IP connection creation rate in connections.py.

Each one resolves the sensor and the quota (resolution.py), records into a `Rate` or
`TokenBucket` held by a `Sensors` store, and turns a violation into a throttle time (throttle.py);
the byte rates, where the proxy paces them, pace with a `Pacer` beside the Rate (pacer.py).
Throttle times returned here are >= 0 and fit in an int32 `throttle_time_ms` field.
"""

from __future__ import annotations

import math
from typing import cast

from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.kinds import kind_of, sensor_name
from kafka_quota_proxy.quota.pacer import Pacer
from kafka_quota_proxy.quota.rate import MetricConfig, Rate
from kafka_quota_proxy.quota.resolution import QuotaResolver, QuotaStore, Resolution, Tags
from kafka_quota_proxy.quota.sensors import LocalStats, SensorHandle, Sensors, StatFactory
from kafka_quota_proxy.quota.shared_fetch import SharedFetchRate
from kafka_quota_proxy.quota.shared_rate import Owed, SharedRate
from kafka_quota_proxy.quota.throttle import (
    INT_MAX,
    java_round,
    rate_throttle_time_ms,
)

# ClientRequestQuotaManager.NanosToPercentagePerSecond: 1 s of one thread is 100 %.
NANOS_TO_PERCENTAGE_PER_SECOND = 100.0 / 1_000_000_000


# A connection's requests whose throttles are kept to settle (ChargeHandle.owed): a Produce is
# read at most every sync interval or so while its entity is over the quota, and two reads settle
# one, so a few are ever unsettled.
OWED_KEPT = 8


def clamp_throttle(ms: int) -> int:
    # Kafka narrows its long throttle with .toInt, which wraps on overflow; clamp instead.
    return 0 if ms < 0 else INT_MAX if ms > INT_MAX else ms


def time_ms_to_percentage(time_ms: float) -> float:
    """Request time in ms -> Kafka's request-time unit (percent of one thread over one second),
    computed as Kafka does from nanoseconds."""
    return time_ms * 1000 * 1000 * NANOS_TO_PERCENTAGE_PER_SECOND


class ResolvedQuota:
    """What every (user, client-id) quota manager shares: the key, its sensors, and the
    resolution of a client to its shared sensor and bound."""

    def __init__(self, key: QuotaKey, store: QuotaStore, config: MetricConfig, sensors: Sensors,
                 stats: StatFactory | None = None) -> None:
        self.key = key
        self.quota_type = sensor_name(key)
        self.config = config
        self.sensors = sensors
        self.stats: StatFactory = stats if stats is not None else LocalStats(config)
        self.store = store
        self.resolver = QuotaResolver(store, key)

    @property
    def quotas_enabled(self) -> bool:
        return self.resolver.quotas_enabled

    def tags(self, user: str, client_id: str | None) -> Tags:
        """The (user tag, client-id tag) of the shared sensor this client is measured on."""
        return self.resolver.resolve(user, client_id).tags

    def quota(self, user: str, client_id: str | None) -> float | None:
        """The bound that applies to this client; None = unlimited."""
        return self.resolver.resolve(user, client_id).quota


class ChargeHandle:
    """What one client connection keeps per quota manager, so that its next charge skips
    resolving its quota and looking its sensor up: good while the quotas (the store's version),
    the principal and the client-id stay as they were and the sensor lives. Measured under the
    100-tenant Produce load, the quota path cost the proxy ~9 µs of CPU per request, four times
    what it takes in a tight loop; most of it was these lookups' calls and dictionary probes."""

    __slots__ = ("version", "user", "client_id", "bound", "sensor", "owed")

    def __init__(self, version: int, user: str, client_id: str | None, bound: float | None,
                 sensor: SensorHandle) -> None:
        self.version = version
        self.user = user
        self.client_id = client_id
        self.bound = bound
        self.sensor = sensor
        # The connection's requests' throttles still to settle at the store's reads (SharedRate.owe)
        self.owed: list[Owed] = []


class ClientQuotaManager(ResolvedQuota):
    """One client quota type (`producer_byte_rate`, `consumer_byte_rate`; `request_percentage`
    through `ClientRequestQuotaManager`), as Kafka's ClientQuotaManager.

    Until a quota of this key has ever been configured nothing is recorded and nothing throttles.
    After that every (user, client-id) is measured on its shared sensor, even where no quota
    applies, and a request violates its quota when the rate after recording is above the bound.
    Byte-rate throttles are not bounded.
    """

    def __init__(self, key: QuotaKey, store: QuotaStore, config: MetricConfig, sensors: Sensors,
                 stats: StatFactory | None = None) -> None:
        if not kind_of(key).per_tenant or key == QuotaKey.CONTROLLER_MUTATION_RATE:
            raise ValueError(f"{key.value} is not a rate-based client quota")
        super().__init__(key, store, config, sensors, stats)
        self.max_throttle_ms: int | None = None  # None: unbounded, as byte rates

    def record_and_get_throttle_ms(self, user: str, client_id: str | None, value: float,
                                   now_ms: float, handles: dict[object, ChargeHandle] | None = None,
                                   paced: bool = False) -> int:
        """Record `value` at `now_ms` and return how long to throttle the client (0 if within quota).
        `handles`: the caller's kept `ChargeHandle`s by manager (one client connection's).
        `paced` (`quota.byte_rate_enforcement: paced`): the bytes are also paced (`Pacer.pace`),
        and the throttle is the time until the sensor's next bytes may come, not Kafka's."""
        kept = handles.get(self) if handles is not None else None
        if (kept is not None and kept.version == self.store.version and kept.user == user
                and kept.client_id == client_id and self.sensors.touch(kept.sensor, now_ms)):
            sensor, bound = kept.sensor, kept.bound
        else:
            res = self.resolver.resolve_if_enabled(user, client_id)
            if res is None:
                return 0
            found = self._sensor(res, now_ms)
            if found is None:
                return 0  # entity cap reached: not measured, so not throttled (counted in `dropped`)
            sensor, bound = found, res.quota
            if handles is not None:
                handles[self] = ChargeHandle(self.store.version, user, client_id, bound, sensor)
        rate: Rate = sensor.stat  # type: ignore[assignment]  # (no cast() call on this path)
        rate.record(value, now_ms)
        if paced and bound is not None:
            pacer = sensor.pacer or self._pacer(sensor)
            return clamp_throttle(math.ceil(pacer.pace(value, bound, now_ms) - now_ms))
        if bound is None:
            return 0
        if self.key == QuotaKey.CONSUMER_BYTE_RATE and rate.takes_turns():
            fetch_rate = cast(SharedFetchRate, rate)
            measured, decided = fetch_rate.fetch_turn(now_ms, value, bound)
            if decided is not None:
                return decided
            throttle = clamp_throttle(rate_throttle_time_ms(rate, measured, bound, now_ms,
                                                             self.max_throttle_ms))
            fetch_rate.muted(now_ms, now_ms + throttle)
            return throttle
        if rate.owes and handles is not None:
            # Shared with other replicas (a Produce quota): Kafka's throttle, settled at the
            # store's next reads (SharedRate.owe); the connection is held for what is owed.
            measured, owed = cast(SharedRate, rate).owe(now_ms, bound)
            handle = handles.get(self)
            if handle is not None and owed is not None:
                kept_owed = handle.owed
                if len(kept_owed) >= OWED_KEPT:
                    del kept_owed[0]
                kept_owed.append(owed)
        elif rate.surely_within(bound, now_ms):
            return 0
        else:
            measured = rate.measure(now_ms)
        if measured <= bound:
            return 0
        if self.key == QuotaKey.CONSUMER_BYTE_RATE:
            # A fetch over quota delivers nothing and is taken back: all or nothing. With the
            # quota shared, one over it only on the others' predicted bytes is decided by its
            # part of the headroom (SharedRate.judge_fetch).
            measured, decided = rate.judge_fetch(now_ms, value, measured, bound)
            if decided is not None:
                return decided
        return clamp_throttle(rate_throttle_time_ms(rate, measured, bound, now_ms, self.max_throttle_ms))

    def paced_wait_ms(self, user: str, client_id: str | None, now_ms: float,
                      handles: dict[object, ChargeHandle] | None = None, admit: bool = False) -> int:
        """(`quota.byte_rate_enforcement: paced`) How long until this client's next bytes may be
        let in (`Pacer.paced_wait_ms`; `admit`: for a request about to be read, `Pacer.admit_wait_ms`):
        0 when they may come now, or when no quota applies. Records nothing; makes the client's
        sensor for a request about to be read (`admit`) where a quota applies, so that a fleet's
        replicas ask for a turn for their first request too (quota/turns.py): without it each of
        10 replicas let its first 2 MB fetch in at once."""
        found = self._measured(user, client_id, now_ms, handles)
        if found is None and admit:
            found = self._made(user, client_id, now_ms)
        if found is None:
            return 0
        sensor, bound = found
        pacer = self._pacer(sensor)
        if admit:
            pacer.paced_at(bound)
        wait = pacer.admit_wait_ms(now_ms) if admit else pacer.paced_wait_ms(now_ms)
        return clamp_throttle(math.ceil(wait)) if wait > 0 else 0

    def owed_wait_ms(self, handles: dict[object, ChargeHandle], now_ms: float) -> int:
        """(Kafka's mode, the quota shared with other replicas) How long the connection whose
        `handles` these are must still wait before its next request is read: until its
        requests' throttles are paid, as settled on the reads since (`Owed.until_ms`). 0 when
        nothing is owed."""
        handle = handles.get(self)
        if handle is None or not handle.owed:
            return 0
        stat = cast(SharedRate, handle.sensor.stat)
        until = -math.inf
        guessed = False
        unsettled = []
        for owed in handle.owed:
            owed_until = owed.until_ms
            if owed_until > until:
                until = owed_until
            guessed = guessed or owed.guess > 0
            # Settled by the two reads after it (SharedRate._reveal) and paid: forgotten.
            if stat.reads < owed.reads + 2 or owed_until > now_ms:
                unsettled.append(owed)
        handle.owed = unsettled
        if until <= now_ms:
            return 0
        # Rounded as the throttle told is (java_round): what was told and paid is not owed again.
        wait = clamp_throttle(java_round(until - now_ms))
        if guessed:
            # Held for a guess of the others' first bytes: asked again at the next read, which
            # may show them.
            wait = min(wait, stat.home.until_next_read_ms(now_ms))
        return wait

    def charge(self, user: str, client_id: str | None, value: float, now_ms: float,
               handles: dict[object, ChargeHandle], paced: bool = False) -> tuple[int, bool]:
        """A Produce charged on arrival, in one call: its throttle (`record_and_get_throttle_ms`)
        and whether its connection is to read one request at a time, as a broker does: when
        throttled, or over its quota by its bytes so far (`over_so_far`). Paced, never: its
        requests wait for their turns instead."""
        throttle_ms = self.record_and_get_throttle_ms(user, client_id, value, now_ms, handles, paced)
        if paced:
            return throttle_ms, False
        return throttle_ms, bool(throttle_ms) or self.over_so_far(handles, now_ms)

    def over_so_far(self, handles: dict[object, ChargeHandle], now_ms: float) -> bool:
        """Whether the client whose connection keeps `handles`, just charged by
        `record_and_get_throttle_ms` with them, sent faster than its quota over the time its
        sensor actually spans (`Rate.rate_so_far`; with the quota shared, this replica's own
        bytes): a connection then reads one request at a time, as Kafka's broker always does,
        since each request read ahead is charged before the answers that would throttle it.
        False where no quota applies. From the kept handle alone: this runs on every Produce."""
        handle = handles.get(self)
        if handle is None or handle.bound is None:
            return False
        rate: Rate = handle.sensor.stat  # type: ignore[assignment]  # (no cast() call on this path)
        return rate.over_so_far(handle.bound, now_ms)

    def pace_ms(self, user: str, client_id: str | None, size: float, now_ms: float,
                handles: dict[object, ChargeHandle] | None = None) -> int:
        """How long to hold a client that was just delivered `size` bytes over its quota (a
        ShareFetch the proxy delivers, `Pacer.pace_ms`): its deliveries while over the quota are
        spaced at the quota, whatever the window's bursts. 0 where no quota applies."""
        found = self._measured(user, client_id, now_ms, handles)
        if found is None or found[1] <= 0:
            return 0
        sensor, bound = found
        return clamp_throttle(math.ceil(self._pacer(sensor).pace_ms(size, bound, now_ms)))

    def _pacer(self, sensor: SensorHandle) -> Pacer:
        """The pacer beside the sensor's rate, made the first time its bytes are paced (by the
        stat factory: a rate shared with other replicas is paced at its part of the quota)."""
        pacer = sensor.pacer
        if pacer is None:
            pacer = sensor.pacer = self.stats.pacer(cast(Rate, sensor.stat))
        return pacer

    def _made(self, user: str, client_id: str | None, now_ms: float) -> tuple[SensorHandle, float] | None:
        """The client's sensor, made if it has none, and its quota; None where no quota applies
        or the entity cap is reached."""
        res = self.resolver.resolve_if_enabled(user, client_id)
        if res is None or res.quota is None:
            return None
        handle = self._sensor(res, now_ms)
        if handle is None:
            return None
        return handle, res.quota

    def _sensor(self, res: Resolution, now_ms: float) -> SensorHandle | None:
        """The handle of the sensor `res` names, made if there is none; None at the entity cap."""
        make = self.stats.rate
        sensor_key = res.sensor_key
        return self.sensors.handle(sensor_key, now_ms, lambda: make(sensor_key))

    def _measured(self, user: str, client_id: str | None, now_ms: float,
                  handles: dict[object, ChargeHandle] | None) -> tuple[SensorHandle, float] | None:
        """The client's sensor and quota, from its kept `ChargeHandle` if still good, else
        resolved; None where no quota applies or nothing was recorded yet. Makes no sensor."""
        kept = handles.get(self) if handles is not None else None
        sensor: SensorHandle | None
        if (kept is not None and kept.version == self.store.version and kept.user == user
                and kept.client_id == client_id and kept.sensor.live):
            sensor, bound = kept.sensor, kept.bound
        else:
            res = self.resolver.resolve_if_enabled(user, client_id)
            if res is None:
                return None
            sensor, bound = self.sensors.found(res.sensor_key, now_ms), res.quota
        if bound is None or sensor is None:
            return None
        return sensor, bound

    def record_no_throttle(self, user: str, client_id: str | None, value: float, now_ms: float) -> None:
        """Record without checking the quota: it weighs on the next requests only (recordNoThrottle)."""
        if not self.resolver.quotas_enabled:
            return
        res = self.resolver.resolve(user, client_id)
        make = self.stats.rate
        key = res.sensor_key
        rate = self.sensors.get_or_create(key, now_ms, lambda: make(key))
        if rate is not None:
            rate.record(value, now_ms)

    def unrecord(self, user: str, client_id: str | None, value: float, now_ms: float) -> None:
        """Take back a recorded `value` by recording `-value`: a throttled fetch returns no data."""
        self.record_no_throttle(user, client_id, -value, now_ms)

    def max_value_in_quota_window(self, user: str, client_id: str | None) -> float:
        """The most that can be recorded in one go without a certain throttle, Q * (N-1) * W:
        what a fetch's max_bytes is capped at. math.inf when unlimited (Kafka: Double.MAX_VALUE)."""
        if not self.resolver.quotas_enabled:
            return math.inf
        bound = self.resolver.resolve(user, client_id).quota
        if bound is None:
            return math.inf
        return bound * (self.config.samples - 1) * self.config.window_s

    def measure(self, user: str, client_id: str | None, now_ms: float) -> float:
        """The current rate of this client's shared sensor (0.0 if it has none)."""
        res = self.resolver.resolve(user, client_id)
        stat = self.sensors.get(res.sensor_key, now_ms)
        return 0.0 if stat is None else cast(Rate, stat).measure(now_ms)


class ClientRequestQuotaManager(ClientQuotaManager):
    """`request_percentage` (KIP-124): request time in ms is recorded as percent-seconds of one
    thread, and a throttle is bounded to one quota window (W ms)."""

    def __init__(self, store: QuotaStore, config: MetricConfig, sensors: Sensors) -> None:
        super().__init__(QuotaKey.REQUEST_PERCENTAGE, store, config, sensors)
        self.max_throttle_ms = config.window_ms
        # The global exempt-request-time sensor: never expires, so not in `sensors`.
        self._exempt = Rate(config)

    def record_and_get_throttle_ms(self, user: str, client_id: str | None, time_ms: float,
                                   now_ms: float, handles: dict[object, ChargeHandle] | None = None,
                                   paced: bool = False) -> int:
        """Record the request's time in ms (its io-thread time, in Kafka) and return the throttle.
        Request time is never paced (`paced` is the byte rates' alone): Kafka's throttle, always."""
        return super().record_and_get_throttle_ms(user, client_id, time_ms_to_percentage(time_ms), now_ms,
                                                  handles)

    def record_no_throttle(self, user: str, client_id: str | None, time_ms: float,
                           now_ms: float) -> None:
        """Record time in ms (network-thread time, in Kafka) without a check: later requests pay."""
        super().record_no_throttle(user, client_id, time_ms_to_percentage(time_ms), now_ms)

    def record_exempt(self, time_ms: float, now_ms: float) -> None:
        """Time spent on an exempt request, in the global `exempt-request-time` only."""
        if self.resolver.quotas_enabled:
            self._exempt.record(time_ms_to_percentage(time_ms), now_ms)

    def exempt_request_time(self, now_ms: float) -> float:
        return self._exempt.measure(now_ms)
