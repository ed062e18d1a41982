"""The proxy's own pacing of a sensor's bytes, beside Kafka's `Rate` (rate.py): a stat of its own, as
a Kafka Sensor holds several stats, so that the Rate stays the port of Kafka's and nothing else.

Two pacers in one `Pacer`, both not Kafka's: the ShareFetch deliveries over quota (`pace_ms`), and
`quota.byte_rate_enforcement: paced` (`pace`, a GCRA). A quota manager makes one for a sensor the
first time it paces it (`SensorHandle.pacer`). Time is passed in: nothing here reads a clock.
"""

from __future__ import annotations

from kafka_quota_proxy.quota.rate import MetricConfig


class Pacer:
    """The pacing of one sensor's bytes at its quota, for all of the sensor's connections
    together. Its quota is told on each call (it may change); a rate shared with other replicas
    paces at its part of it (`shared_pacer.SharedPacer`)."""

    __slots__ = ("_window", "_credit", "_paced_until", "_admit_at", "bound")

    def __init__(self, config: MetricConfig) -> None:
        self._window = config.window_ms
        # Kafka's first allowance: a fresh window of Kafka's Rate takes (N-1) W of quota before
        # it throttles.
        self._credit = float((config.samples - 1) * config.window_ms)
        # Where `pace_ms` has spaced this sensor's deliveries out to (see there).
        self._paced_until = -float("inf")
        # `quota.byte_rate_enforcement: paced` (`pace`): when the bytes let in so far are paid for
        # at the quota, and the quota they were last paced at (None: never paced).
        self._admit_at = -float("inf")
        self.bound: float | None = None

    def quota_share(self) -> float:
        """The part of the quota this sensor's own bytes may pace at: all of it here. A rate shared
        with other replicas paces at its part of the fleet's bytes (`SharedPacer.quota_share`)."""
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
        here; with the quota shared, maybe a little longer (`SharedPacer.admit_wait_ms`)."""
        return self._admit_at - now_ms

    def paced_at(self, bound: float) -> None:
        """(`quota.byte_rate_enforcement: paced`) The quota this sensor's bytes are paced at, told
        before the first `pace`: a rate shared with other replicas then paces the others' bytes
        it reads from the first read on (`SharedPacer.read`), not from its own first bytes."""
        self.bound = bound

    def pace(self, size: float, bound: float, now_ms: float) -> float:
        """(`quota.byte_rate_enforcement: paced`) Let `size` bytes in at `now_ms`: they are paid
        for `size / bound` after the later of the paced time and `now_ms` less the credit a
        client builds up while below its quota, at most (N-1) W of it, Kafka's first allowance
        (a fresh window of Kafka's Rate takes (N-1) W of quota before it throttles). After that
        a flat-out client is let in at the quota, whatever its number of connections. A virtual
        scheduling (GCRA) token bucket, not Kafka's Rate. Returns when the next bytes may come
        at the earliest (SharedPacer: later, if the others send meanwhile)."""
        self.bound = bound
        start = self._admit_at
        floor = now_ms - self._credit_ms()
        if start < floor:
            start = floor
        paid = size * 1000.0 / bound
        part = self._part()
        if part == 1.0:
            self._admit_at = start + paid
            return self._admit_at
        # Shared with other replicas, its own bytes are paced at its part of the quota until the
        # next read shows the others' (SharedPacer.read). The client is told (and muted for) its
        # turn by that guess less the credit, so that it is back in time for the turn when the
        # others sent less; the pace holds it until then. (Muted for the whole guess, 10
        # replicas of one 1 MB producer each got 0.93 of the quota in bench.many_connections_sim;
        # for its own bytes alone, they all waited for each turn and took it together: 1.36x.)
        self._admit_at = start + paid / part
        return max(start + paid, self._admit_at - self._credit_ms())

    def _credit_ms(self) -> float:
        """The most credit a client builds up while below its quota: (N-1) W (see SharedPacer)."""
        return self._credit

    def _part(self) -> float:
        """The part of the quota this sensor's own bytes are paced at: all of it (see SharedPacer)."""
        return 1.0

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(bound={self.bound}, admit_at={self._admit_at}, "
                f"paced_until={self._paced_until})")
