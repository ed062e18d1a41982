"""Many connections, one quota: N clients under one client-id, each on its own connection, held
to one `producer_byte_rate` (or `consumer_byte_rate`) by Kafka's broker, or by the proxy, on a
simulated clock. No processes, no network: the quota arithmetic is the proxy's own `QuotaEngine`
(whose `Rate` is Kafka's to the millisecond), and what differs between the two servers is only
where and when they read, charge and mute, modelled from their code:

- **Kafka's broker** (`SocketServer.Processor`, `KafkaApis.handleProduceRequest`,
  `ClientQuotaManager`, KIP-219): it reads one request per connection at a time
  (`selector.mute` on each completed receive, unmuted once its response is sent); a Produce is
  recorded once its append is done, its throttle computed then, the response sent at once with
  it, and the channel kept muted until `record time + throttle` (`ThrottledChannel`). A Fetch is
  recorded with its response's size; over quota it is taken back and answered empty.
- **The proxy** (`proxy/stages/quota_charge.py`, `proxy/datapath/client.py`): it reads up to
  `max_inflight_requests` (5) requests per connection ahead of their answers, one at a time
  once the client is over its quota or over it by its bytes so far (`read_alone`); a Produce is
  charged when it is read, and one over quota is the last read until its response has been
  written and its throttle has passed (the mute starts at the write). A Fetch is charged at its
  response (`quota_settle.py`), as on Kafka.

The clients are modelled on librdkafka, whose producer does not back off on `throttle_time_ms`
(it only reports it: confluentinc/librdkafka#5592, KIP-219 client-side throttling, is open): a
flat-out application keeps `queue.buffering.max.kbytes` (4 MiB) full; batches of up to
`batch.size` go out as soon as they are full or `linger.ms` (5) after their first record, with no
bound on the requests in flight but the queue; so a muted connection's next requests wait in its
socket. A consumer (of a group: a partition each) keeps one Fetch in flight and sends the next as
soon as one is answered. `simulate(client="java")` models the Java client instead: at most 5
requests in flight, and nothing sent to a broker until the throttle a response carried is over.
The broker's appends to the producers' one partition are served one at a time, in arrival order.
`simulate(replicas=R)` spreads the connections over R proxies whose engines share the quota
through an ideal store synced every 100 ms (as `bench.shared_sim`); the workers of one
`--workers` proxy share it the same way.

What is measured is what issue 27 measured: the clients' acknowledged (for consumers, delivered)
value bytes over 11-55 s against the quota, and the fullest sliding 11 s window in that span;
`--seconds 300 --measured-from 20` gives the long run, where the window's echo of the first burst
(Kafka's first allowance, given back when its sample leaves the window) weighs less.

What it found: the proxy's default holds N connections as Kafka's broker does, within 1% of
the rate and 0.04x of the fullest window over 280 s (docs/quotas.md, "Many connections"). The
overshoot with many connections is Kafka's formula's: each request over quota throttles its own
connection for (O - T) / T * W, the time that brings the rate back to the quota were nothing else
sent; the entity's other connections each send a request meanwhile, and each is throttled on its
own in turn, so the rate settles where N requests per throttle balance it.

The option `quota.byte_rate_enforcement: paced` is modelled as the proxy does it: a Produce or
Fetch read off any connection of the entity waits, unhandled, until the entity's pace lets it in
(`QuotaCharge.hold_ms`); a Fetch answered when another connection took the turn meanwhile is
answered empty (`QuotaSettle`). Replicas take turns through the store's queue (quota/turns.py,
`Queues` here); `--no-turns` shows them taking their chance of a turn at each read instead.

    python -m bench.many_connections_sim                      # both tables, issue 27's span, 3 seeds
    python -m bench.many_connections_sim --table kafka --connections 3 --seconds 300 --measured-from 20
    python -m bench.many_connections_sim --table paced --replicas 1 3 10
"""

from __future__ import annotations

import argparse
import bisect
import functools
import itertools
import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.many_connections_servers import (
    CLIENT_ID,
    Clock,
    KafkaBroker,
    Partition,
    Proxy,
    Request,
    Server,
    Timing,
)
from bench.shared_accuracy import SLIDING_S, fullest_window
from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.turns import Turns

QUOTA = 1_000_000  # bytes/s, issue 27's producer_byte_rate
VALUE = 1000  # bytes per record value
RECORD_OVERHEAD = 10  # a v2 record's own fields around a 1000-byte value, no key, no headers
BATCH_OVERHEAD = 61  # a v2 record batch's header
REQUEST_OVERHEAD = 60  # a Produce request's header and topic/partition fields
SERVERS = ("kafka", "proxy")
LIBRDKAFKA_BATCH = 1_000_000  # librdkafka's batch.size default, which issue 27's producers kept


TIMING = Timing()  # the default timing (frozen, so one for every run)


@dataclass
class Producer:
    """A flat-out librdkafka producer on one connection (or, `java`, the Java producer)."""

    clock: Clock
    conn: int
    server: Server
    batch_bytes: int
    queue_bytes: int = 4096 * 1024
    linger_ms: float = 5.0
    java: bool = False
    acked: list[tuple[float, int]] = field(default_factory=list)
    _unsent: deque[list[float]] = field(default_factory=deque)  # [enqueued at, records]
    _unsent_n: int = 0
    _inflight: int = 0
    _throttled_until: float = 0.0
    _wake_at: float | None = None

    def __post_init__(self) -> None:
        self.batch_records = min(10_000, max(1, self.batch_bytes // (VALUE + RECORD_OVERHEAD)))

    def start(self) -> None:
        self._enqueue(self.queue_bytes // VALUE)
        self._send()

    def _enqueue(self, records: int) -> None:
        self._unsent.append([self.clock.now, records])
        self._unsent_n += records

    def _send(self) -> None:
        clock = self.clock
        max_inflight = 5 if self.java else 1_000_000
        while self._unsent_n and self._inflight < max_inflight:
            if clock.now < self._throttled_until:
                self._wake(self._throttled_until)
                return
            oldest = self._unsent[0][0]
            if self._unsent_n < self.batch_records and clock.now < oldest + self.linger_ms:
                self._wake(oldest + self.linger_ms)
                return
            records = self._take(self.batch_records)
            size = REQUEST_OVERHEAD + BATCH_OVERHEAD + records * (VALUE + RECORD_OVERHEAD)
            self._inflight += 1
            self.server.send(Request(self.conn, size, records))

    def _take(self, n: int) -> int:
        taken = 0
        while taken < n and self._unsent:
            head = self._unsent[0]
            part = min(int(head[1]), n - taken)
            head[1] -= part
            taken += part
            if not head[1]:
                self._unsent.popleft()
        self._unsent_n -= taken
        return taken

    def _wake(self, when: float) -> None:
        if self._wake_at is not None and self._wake_at <= when:
            return
        self._wake_at = when

        def wake() -> None:
            if self._wake_at == when:
                self._wake_at = None
                self._send()
        self.clock.at(when, wake)

    def answered(self, request: Request) -> None:
        self._inflight -= 1
        self.acked.append((self.clock.now, request.records * VALUE))
        if self.java and request.throttle_ms:
            self._throttled_until = self.clock.now + request.throttle_ms
        self._enqueue(request.records)  # the application fills the queue again at once
        self._send()


@dataclass
class Consumer:
    """A librdkafka consumer reading its own partitions flat out: one Fetch in flight, the next
    sent as soon as one is answered (an empty, throttled one too: it does not back off)."""

    clock: Clock
    conn: int
    server: Server
    fetch_bytes: int
    java: bool = False
    acked: list[tuple[float, int]] = field(default_factory=list)

    def start(self) -> None:
        self._fetch()

    def _fetch(self) -> None:
        records = self.fetch_bytes // (VALUE + RECORD_OVERHEAD)
        size = 4 + 100 + BATCH_OVERHEAD + records * (VALUE + RECORD_OVERHEAD)
        self.server.send(Request(self.conn, size, records))

    def answered(self, request: Request) -> None:
        if request.delivered:
            self.acked.append((self.clock.now, request.records * VALUE))
        if self.java and request.throttle_ms:
            self.clock.at(self.clock.now + request.throttle_ms, self._fetch)
        else:
            self._fetch()


def _engines(replicas: int, kind: str, clock: Clock, settings: QuotaSettings,
             sync_ms: float, seed: int, turns: bool = True) -> list[QuotaEngine]:
    key = QuotaKey.PRODUCER_BYTE_RATE if kind == "produce" else QuotaKey.CONSUMER_BYTE_RATE
    quotas = {QuotaEntity(client_id=CLIENT_ID): {key: float(QUOTA)}}
    engines = []
    for index in range(replicas):
        engine = QuotaEngine(settings, QuotaStore(quotas), clock=lambda: int(clock.now),
                             shared_buckets=1 if replicas > 1 else None)
        if engine.shared is not None:
            engine.shared.live_replicas = replicas
            engine.shared.read_every_ms = sync_ms
            engine.shared.rng = random.Random(seed * 1000 + index)
            if turns:
                engine.shared.turns = Turns(sync_ms)
        engines.append(engine)
    if replicas > 1:
        _sync(clock, engines, sync_ms)
    return engines


class Queues:
    """The store's queues of turns (quota/turns.py), ideal: per key, each replica's claim (the
    order it first asked in, when it last asked); a claim not renewed for `stale_ms` is dropped,
    as a dead replica's."""

    def __init__(self, stale_ms: float) -> None:
        self.stale_ms = stale_ms
        self.claims: dict[str, dict[int, tuple[int, float]]] = {}
        self.order = itertools.count()

    def sync(self, replica: int, left: Sequence[str], waiting: Sequence[str],
             now: float) -> tuple[set[str], set[str]]:
        """One replica's claims given up and made or renewed; (the keys it heads, the keys
        another replica waits on too)."""
        for key in left:
            self.claims.get(key, {}).pop(replica, None)
        for key in waiting:
            queue = self.claims.setdefault(key, {})
            order = queue[replica][0] if replica in queue else next(self.order)
            queue[replica] = (order, now)
        heads, crowded = set(), set()
        for key in waiting:
            queue = self.claims[key]
            for r in [r for r, (_, at) in queue.items() if now - at > self.stale_ms]:
                del queue[r]
            if min(queue, key=lambda r: queue[r][0]) == replica:
                heads.add(key)
            if len(queue) > 1:
                crowded.add(key)
        return heads, crowded


def _sync(clock: Clock, engines: Sequence[QuotaEngine], sync_ms: float) -> None:
    """Every replica syncs every `sync_ms` with an ideal store: its absolute counts in, the sums
    over all replicas out (`bench.shared_sim`'s store), and its claims on the paced quotas'
    queues."""
    store: dict[str, dict[int, dict[int, int]]] = {}
    queues = Queues(3 * sync_ms)

    def sync(i: int) -> None:
        registry = engines[i].shared
        assert registry is not None
        now = int(clock.now)
        turns = registry.turns
        for batch in registry.collect(now):
            for key, writes in batch.writes.items():
                for sample, value in writes.items():
                    store.setdefault(key, {}).setdefault(sample, {})[i] = value
            totals = {key: {s: sum(store.get(key, {}).get(s, {}).values()) for s in wanted}
                      for key, wanted in batch.reads.items()}
            registry.applied(batch, totals, False, now)
        if turns is not None:
            turns.answered(*queues.sync(i, *turns.claims(now), now))
        clock.at(clock.now + sync_ms, lambda: sync(i))

    for i in range(len(engines)):
        clock.at(clock.rng.uniform(0, sync_ms), functools.partial(sync, i))


@dataclass(frozen=True)
class Outcome:
    rate: float  # delivered value bytes/s over the measured span, / the quota
    worst: float  # the fullest sliding 11 s window in it, / the quota's worth


def simulate(server: str = "proxy", connections: int = 3, kind: str = "produce", replicas: int = 1,
             enforcement: str = "kafka", client: str = "librdkafka", batch_bytes: int = LIBRDKAFKA_BATCH,
             seconds: float = 55.0, measured_from: float = 11.0, seed: int = 1,
             timing: Timing = TIMING, sync_ms: float = 100.0, turns: bool = True) -> Outcome:
    """One run: `connections` clients flat out from t=0 for `seconds`, measured from
    `measured_from` on. `turns`: the store keeps the paced quotas' turns (quota/turns.py), as
    the proxy's store does; False, each replica takes its chance of a turn."""
    clock = Clock(seed, timing)
    settings = QuotaSettings(scope="cluster" if replicas > 1 else "broker", byte_rate_enforcement=enforcement)
    if server == "kafka" and replicas != 1:
        raise ValueError("Kafka's broker shares no quota between brokers")
    engines = _engines(replicas, kind, clock, settings, sync_ms, seed, turns)
    clients: list[Producer | Consumer] = []

    def answered(request: Request) -> None:
        clients[request.conn].answered(request)

    # One partition for the producers (issue 27's topic); a partition each for the consumers of
    # one group.
    shared_partition = Partition(clock)
    own: dict[int, Partition] = {}

    def partition(conn: int) -> Partition:
        if kind == "produce":
            return shared_partition
        return own.setdefault(conn, Partition(clock))

    servers: list[Server] = []
    for engine in engines:
        if server == "kafka":
            servers.append(KafkaBroker(clock, engine, kind, answered, partition))
        else:
            servers.append(Proxy(clock, engine, kind, answered, partition))
    java = client == "java"
    for conn in range(connections):
        target = servers[conn % len(servers)]
        if kind == "produce":
            clients.append(Producer(clock, conn, target, batch_bytes, java=java))
        else:
            clients.append(Consumer(clock, conn, target, batch_bytes, java=java))
    for c in clients:
        clock.at(clock.rng.uniform(0, 10), c.start)
    end = seconds * 1000
    clock.run(end)
    events = sorted(e for c in clients for e in c.acked)
    times = [t for t, _ in events]
    cumulative = [0]
    for _, n in events:
        cumulative.append(cumulative[-1] + n)

    def upto(t_ms: float) -> int:
        return cumulative[bisect.bisect_right(times, t_ms)]

    span = seconds - measured_from
    rate = (upto(end) - upto(measured_from * 1000)) / span / QUOTA
    worst = fullest_window(lambda s: upto(s * 1000), measured_from, seconds) / (QUOTA * SLIDING_S)
    return Outcome(rate, worst)


@dataclass(frozen=True)
class Case:
    """One line of a table: who holds the quota, and the load."""

    server: str  # "kafka" or "proxy"
    connections: int
    kind: str = "produce"
    replicas: int = 1
    enforcement: str = "kafka"
    client: str = "librdkafka"
    batch_bytes: int = LIBRDKAFKA_BATCH
    turns: bool = True

    def name(self) -> str:
        b = self.batch_bytes
        size = f"{b // 1000} kB" if b % 1024 else f"{b // 1024} KiB"
        where = "Kafka" if self.server == "kafka" else (
            f"proxy {self.enforcement}" + (f", {self.replicas} replicas" if self.replicas > 1 else "")
            + ("" if self.turns or self.replicas == 1 else ", no turns"))
        unit = "fetches" if self.kind == "consume" else "batches"
        return f"{self.kind}, {self.connections} conns, {size} {unit} ({self.client}), {where}"


def measure(case: Case, seeds: int, seconds: float, measured_from: float) -> tuple[str, str]:
    results = [simulate(case.server, case.connections, case.kind, case.replicas, case.enforcement,
                        case.client, case.batch_bytes, seconds, measured_from, seed,
                        turns=case.turns)
               for seed in range(1, seeds + 1)]
    rates = [o.rate for o in results]
    worst = [o.worst for o in results]
    return (case.name(), f"{statistics.mean(rates):.3f} ({min(rates):.3f}-{max(rates):.3f}), "
                         f"fullest 11 s {statistics.mean(worst):.2f}x (worst {max(worst):.2f}x)")


def kafka_and_proxy(connections: Sequence[int] = (1, 3, 10)) -> list[Case]:
    """Part 2's table: Kafka's broker and the proxy's default, the same clients."""
    return [Case(server, n, kind, batch_bytes=batch)
            for kind, batch in (("produce", LIBRDKAFKA_BATCH), ("produce", 128 * 1024),
                                ("consume", LIBRDKAFKA_BATCH), ("consume", 256 * 1024))
            for n in connections for server in SERVERS]


def paced(connections: Sequence[int] = (1, 3, 10), replicas: Sequence[int] = (1, 3, 10),
          sizes: Sequence[int] | None = None, turns: bool = True) -> list[Case]:
    """`quota.byte_rate_enforcement: paced`: N connections on one proxy, and spread over R
    replicas sharing the quota; `sizes`: the batches and fetches, bytes (by default 1 MB and
    128 KiB); `turns`: False for replicas taking their chance of a turn, without the store's
    queue."""
    sizes = (LIBRDKAFKA_BATCH, 128 * 1024) if sizes is None else sizes
    return [Case("proxy", n, kind, r, "paced", batch_bytes=batch, turns=turns)
            for kind in ("produce", "consume") for batch in sizes
            for r in replicas for n in connections if n >= r]


def run() -> list[tuple[str, str]]:
    """`make bench BENCH=many_connections_sim`: issue 27's span (11-55 s), 3 seeds each."""
    return [measure(case, 3, 55.0, 11.0) for case in kafka_and_proxy() + paced()]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.many_connections_sim")
    ap.add_argument("--table", choices=["kafka", "paced"], nargs="*", default=["kafka", "paced"])
    ap.add_argument("--connections", type=int, nargs="*", default=[1, 3, 10])
    ap.add_argument("--replicas", type=int, nargs="*", default=[1, 3, 10])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--no-turns", action="store_true",
                    help="paced replicas take their chance of a turn, without the store's queue "
                         "(as before it kept one)")
    ap.add_argument("--seconds", type=float, default=55.0)
    ap.add_argument("--measured-from", type=float, default=11.0)
    ap.add_argument("--sizes-kib", type=int, nargs="*", default=None, metavar="KIB",
                    help="the paced table's batch and fetch sizes, KiB (default: 1 MB and 128); "
                         "bench.shared_accuracy's consumers fetch about 1,950 KiB at a time")
    args = ap.parse_args()
    cases = []
    if "kafka" in args.table:
        cases += kafka_and_proxy(args.connections)
    if "paced" in args.table:
        sizes = None if args.sizes_kib is None else [k * 1024 for k in args.sizes_kib]
        cases += paced(args.connections, args.replicas, sizes, not args.no_turns)
    for case in cases:
        name, value = measure(case, args.seeds, args.seconds, args.measured_from)
        print(f"{name:75s} {value}", flush=True)


if __name__ == "__main__":
    main()
