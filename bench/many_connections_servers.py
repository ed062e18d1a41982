"""bench.many_connections_sim's servers on a fake clock: Kafka's broker (a connection muted for its
throttle after its response, one request read at a time) and the proxy (its quota managers, the
requests read ahead, Kafka's throttle or the paced turns), in front of one partition's appends."""

from __future__ import annotations

import functools
import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine, ScopeManagers
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.managers import ChargeHandle, ClientQuotaManager

CLIENT_ID = "bulk"


@dataclass(frozen=True)
class Timing:
    """How long things take, in ms. Loopback on a busy machine: the broker's append is the
    bottleneck (one partition), the network next to nothing."""

    latency_ms: float = 0.1  # one way, per hop
    link_mb_s: float = 1000.0  # bytes moved per ms on a hop: 1 MB/ms
    broker_base_ms: float = 0.3
    broker_mb_s: float = 200.0  # the partition's appends (and reads)
    proxy_ms: float = 0.05  # the proxy's own work per request
    jitter: float = 0.3  # every service time is scaled by uniform(1 - jitter, 1 + jitter)


@dataclass
class Request:
    conn: int
    size: int  # what a quota counts: Produce request bytes, or Fetch response bytes
    records: int  # the records it carries (a Fetch: those its response would carry)
    throttle_ms: int = 0
    delivered: bool = True  # a Fetch answered with its records, not empty


class Clock:
    """The simulated event loop: callbacks at times in ms, in order, ties in scheduling order."""

    def __init__(self, seed: int, timing: Timing) -> None:
        self.now = 0.0
        self.timing = timing
        self.rng = random.Random(seed)
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (max(when, self.now), next(self._seq), fn))

    def run(self, end_ms: float) -> None:
        while self._events and self._events[0][0] <= end_ms:
            self.now, _, fn = heapq.heappop(self._events)
            fn()

    def jittered(self, ms: float) -> float:
        j = self.timing.jitter
        return ms * self.rng.uniform(1 - j, 1 + j)

    def transfer(self, size: int) -> float:
        t = self.timing
        return t.latency_ms + size / (t.link_mb_s * 1000.0)


class Partition:
    """One partition's appends (or reads), one at a time in arrival order."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.free_at = 0.0

    def serve(self, size: int, done: Callable[[], None]) -> None:
        t = self.clock.timing
        start = max(self.clock.now, self.free_at)
        self.free_at = start + self.clock.jittered(t.broker_base_ms + size / (t.broker_mb_s * 1000.0))
        self.clock.at(self.free_at, done)


class Server:
    """What a client talks to: `send` a request on connection `conn`; the server calls the
    client's `answered(request)` when the response reaches it."""

    def send(self, request: Request) -> None: ...


Answered = Callable[[Request], None]


def manager(engine: QuotaEngine, kind: str) -> ClientQuotaManager:
    scope: ScopeManagers = engine.scope("broker")
    return scope.rates[QuotaKey.PRODUCER_BYTE_RATE if kind == "produce" else QuotaKey.CONSUMER_BYTE_RATE]


class KafkaBroker(Server):
    """Kafka's broker: one request per connection at a time; a Produce recorded after its
    append, a Fetch with its response; the channel muted until record time + throttle."""

    def __init__(self, clock: Clock, engine: QuotaEngine, kind: str, answered: Answered,
                 partition: Callable[[int], Partition]) -> None:
        self.clock = clock
        self.engine = engine
        self.kind = kind
        self.answered = answered
        self.partition = partition
        self.sockets: dict[int, deque[Request]] = {}
        self.busy: set[int] = set()
        self.muted_until: dict[int, float] = {}

    def send(self, request: Request) -> None:
        size = request.size if self.kind == "produce" else 64
        self.clock.at(self.clock.now + self.clock.transfer(size), lambda: self._arrived(request))

    def _arrived(self, request: Request) -> None:
        self.sockets.setdefault(request.conn, deque()).append(request)
        self._poll(request.conn)

    def _poll(self, conn: int) -> None:
        socket = self.sockets.get(conn)
        if not socket or conn in self.busy or self.clock.now < self.muted_until.get(conn, 0.0):
            return
        request = socket.popleft()
        self.busy.add(conn)
        self.partition(conn).serve(request.size, lambda: self._completed(request))

    def _completed(self, request: Request) -> None:
        clock = self.clock
        now = int(clock.now)
        quota = manager(self.engine, self.kind)
        throttle = quota.record_and_get_throttle_ms("", CLIENT_ID, request.size, now)
        if throttle and self.kind == "consume":
            quota.unrecord("", CLIENT_ID, request.size, now)
            request.delivered = False
        request.throttle_ms = throttle
        size = request.size if request.delivered and self.kind == "consume" else 64
        clock.at(clock.now + clock.transfer(size), lambda: self.answered(request))
        conn = request.conn
        self.busy.discard(conn)
        if throttle:
            until = clock.now + throttle
            self.muted_until[conn] = until
            clock.at(until, lambda: self._poll(conn))
        else:
            self._poll(conn)


class Proxy(Server):
    """The proxy in front of a broker without quotas: up to `max_inflight` requests read ahead
    per connection; a Produce charged when read, a Fetch at its response; a request over quota
    stops the reading until its response has been written and its throttle has passed."""

    def __init__(self, clock: Clock, engine: QuotaEngine, kind: str, answered: Answered,
                 partition: Callable[[int], Partition], max_inflight: int = 5) -> None:
        self.clock = clock
        self.engine = engine
        self.kind = kind
        self.answered = answered
        self.partition = partition
        self.max_inflight = max_inflight
        self.sockets: dict[int, deque[Request]] = {}
        self.awaiting: dict[int, int] = {}
        self.throttles_due: dict[int, int] = {}
        self.muted_until: dict[int, float] = {}
        self.handles: dict[int, dict[object, ChargeHandle]] = {}  # each connection's
        self.alone: dict[int, bool] = {}  # ConnectionInfo.read_alone, each connection's

    def send(self, request: Request) -> None:
        size = request.size if self.kind == "produce" else 64
        self.clock.at(self.clock.now + self.clock.transfer(size), lambda: self._arrived(request))

    def _arrived(self, request: Request) -> None:
        self.sockets.setdefault(request.conn, deque()).append(request)
        self._read(request.conn)

    def _hold_ms(self, conn: int) -> int:
        """QuotaCharge.hold_ms: paced, until the entity's pace lets the request in; Kafka's mode
        with the quota shared, a Produce until the connection's last one has paid what it owes."""
        quota = manager(self.engine, self.kind)
        now = int(self.clock.now)
        if self.engine.switches().paced:
            return quota.paced_wait_ms("", CLIENT_ID, now, admit=True)
        if self.kind == "produce" and self.engine.shared is not None:
            return quota.owed_wait_ms(self.handles.setdefault(conn, {}), now)
        return 0

    def _open(self, conn: int) -> bool:
        # One request at a time for a client over its quota, or over it by its bytes so far
        # (ConnectionInfo.read_alone): with up to 5 read ahead, ten producers each had four
        # requests charged in their first milliseconds, 3.6% more than Kafka over 11-55 s.
        ahead = 1 if self.alone.get(conn) else self.max_inflight
        return (self.awaiting.get(conn, 0) < ahead and not self.throttles_due.get(conn, 0)
                and self.clock.now >= self.muted_until.get(conn, 0.0))

    def _read(self, conn: int) -> None:
        socket = self.sockets.get(conn)
        clock = self.clock
        paced = self.engine.switches().paced
        while socket and self._open(conn):
            # Held, as read and unhandled, until the quota lets it in (QuotaCharge.hold_ms).
            wait = self._hold_ms(conn)
            if wait:
                clock.at(int(clock.now) + wait, lambda: self._read(conn))
                return
            request = socket.popleft()
            self.awaiting[conn] = self.awaiting.get(conn, 0) + 1
            if self.kind == "produce":
                quota = manager(self.engine, "produce")
                now, handles = int(clock.now), self.handles.setdefault(conn, {})
                throttle = quota.record_and_get_throttle_ms("", CLIENT_ID, request.size, now, handles, paced)
                request.throttle_ms = throttle
                if throttle:
                    self.throttles_due[conn] = self.throttles_due.get(conn, 0) + 1
                self.alone[conn] = not paced and (bool(throttle) or quota.over_so_far(handles, now))
            size = request.size if self.kind == "produce" else 64
            up = clock.now + clock.timing.proxy_ms + clock.transfer(size)
            clock.at(up, functools.partial(self._forwarded, request))

    def _forwarded(self, request: Request) -> None:
        self.partition(request.conn).serve(request.size, lambda: self._broker_done(request))

    def _broker_done(self, request: Request) -> None:
        clock = self.clock
        size = request.size if self.kind == "consume" else 64
        clock.at(clock.now + clock.transfer(size) + clock.timing.proxy_ms, lambda: self._response(request))

    def _response(self, request: Request) -> None:
        clock = self.clock
        conn = request.conn
        self.awaiting[conn] -= 1
        if self.kind == "consume":
            quota = manager(self.engine, "consume")
            now = int(clock.now)
            if self.engine.switches().paced:
                # QuotaSettle, paced: not yet the entity's turn, answered empty; else delivered,
                # and the connection muted until the next turn.
                throttle = quota.paced_wait_ms("", CLIENT_ID, now)
                if throttle:
                    request.delivered = False
                else:
                    throttle = quota.record_and_get_throttle_ms("", CLIENT_ID, request.size, now,
                                                                paced=True)
            else:
                throttle = quota.record_and_get_throttle_ms("", CLIENT_ID, request.size, now)
                if throttle:
                    quota.unrecord("", CLIENT_ID, request.size, now)
                    request.delivered = False
            if throttle:
                self.throttles_due[conn] = self.throttles_due.get(conn, 0) + 1
            request.throttle_ms = throttle
        size = request.size if request.delivered and self.kind == "consume" else 64
        clock.at(clock.now + clock.transfer(size), lambda: self.answered(request))
        if request.throttle_ms:
            self.throttles_due[conn] -= 1
            until = clock.now + request.throttle_ms
            if until > self.muted_until.get(conn, 0.0):
                self.muted_until[conn] = until
            clock.at(until, lambda: self._read(conn))
        self._read(conn)
