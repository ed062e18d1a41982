"""Many connections, one quota, side by side with Apache Kafka: N librdkafka producers (then 3
consumers of one group) under one client-id, straight to a Kafka 4.4 broker that enforces the
quota itself, and through one proxy that enforces it in front of the same broker with the
broker's quota deleted, in the same run (issue 27).

The load is the issue's: `client.id=bulk`, `linger.ms=5`, `acks=1`, 1 KiB values,
`queue.buffering.max.kbytes=4096`, librdkafka's default `batch.size` of 1 MB (`--batch-kib`;
devkit's producers use 128 KiB), every producer flat out on its own connection, a
`producer_byte_rate` of 1,000,000 B/s. Consumers: one group of 3 reading a 3-partition topic
filled beforehand (more than they can reach), `consumer_byte_rate` 1,000,000 B/s. Each run lasts
`--seconds` (55 by default); the rate is the bytes acknowledged (read, for consumers) from
`--warm-up` (11 s: Kafka's first allowance paid back) to the end, for consumers from `--warm-up`
after the group's first record (its join takes its own time on each path), and the worst window
the most in any sliding 11 s window over that span, stepped every 0.25 s. For producers the same
span is also measured at the broker, from its end offsets read every 50 ms (bench.end_offsets, as
issue 36's bench measures): what it appended, a request the client timed out and sent again counted
as often as it was appended. Beside them, each run's throttled responses and their mean throttle,
and from librdkafka's statistics the Produce requests sent, those timed out and the connections
made, summed over the producers: where the two paths part, they show how.

    python -m bench.many_connections                          # 1, 3 and 10 producers, 3 consumers
    python -m bench.many_connections --producers 3 --consumers 0
    python -m bench.many_connections --paths proxy --proxy-quota byte_rate_enforcement=paced
    python -m bench.many_connections --runs 3      # each case three times: medians, and the gap

With `--runs N` every case runs N times, the two paths one after the other in each round, and
the medians of each path follow, with the proxy's gap from Kafka's broker: the rate's, relative,
and the worst window's, in multiples of the quota's worth, beside the fidelity bounds of issue
36 (rate within 3%, worst window within 0.05x).

Printed, never asserted. Kafka and the proxy share this machine's cores with the clients.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.end_offsets import EndOffsets
from bench.shared_accuracy import SLIDING_S, fullest, fullest_between_readings, settings
from devkit.kafka import KafkaBroker
from devkit.kafka_jvm import run_tool
from devkit.processes import ProxyProcess
from devkit.producing import RECORD, Timeline, produce

CLIENT_ID = "bulk"
QUOTA = 1_000_000
PATHS = ("kafka", "proxy")
RATE_BOUND = 0.03  # the proxy's median rate within 3% of Kafka's (issue 36's fidelity bounds)
WINDOW_BOUND = 0.05  # and its median worst window within 0.05x of the quota's worth


@dataclass
class Result:
    path: str
    kind: str
    clients: int
    rate: float  # bytes/s from the warm-up to the end
    worst_window: float  # bytes in the fullest sliding 11 s window
    errors: int
    since: float  # seconds after the start that the span began (span_start)
    worst_at: float = 0.0  # where the fullest window starts, seconds after the start
    # consumers: each member's assignments and revocations, (seconds after the start, what), and
    # the group's stalls in the span, (from, seconds): what can make a window fuller than the
    # quota (a stalled entity's rate empties, and it takes the stall's worth at once after)
    rebalances: list[tuple[float, str]] = field(default_factory=list)
    stalls: list[tuple[float, float]] = field(default_factory=list)
    round: int = 0  # which of `--runs` rounds
    # producers: what the broker appended (its end offsets), over the same span: the rate and the
    # fullest window, counting a request the client timed out and sent again as often as the
    # broker appended it. None for consumers.
    appended: float | None = None
    appended_worst: float | None = None
    # producers, from their throttle_cb and librdkafka's statistics, summed over them: throttled
    # responses, their mean throttle (ms), requests timed out, connections made, Produce requests
    throttled: int = 0
    throttle_mean_ms: float = 0.0
    timeouts: int = 0
    connects: int = 0
    requests: int = 0


def case_name(kind: str, clients: int) -> str:
    return f"{kind}, {clients} {'producers' if kind == 'produce' else 'consumers'}"


def as_the_clients_saw(r: Result) -> tuple[float, float] | None:
    return r.rate, r.worst_window


def as_the_broker_appended(r: Result) -> tuple[float, float] | None:
    if r.appended is None or r.appended_worst is None:
        return None
    return r.appended, r.appended_worst


VIEWS: tuple[tuple[str, Callable[[Result], tuple[float, float] | None]], ...] = (
    ("", as_the_clients_saw), (" at the broker", as_the_broker_appended))


def medians(results: Sequence[Result]) -> list[tuple[str, str]]:
    """Each case's median rate and worst window per path over its runs, as multiples of the quota
    (of its worth, for windows), then the proxy's gap from Kafka's broker where both ran, and
    whether it is within the fidelity bounds: as the clients saw them, then (producers) as the
    broker appended them."""
    cases: dict[tuple[str, int], dict[str, list[Result]]] = {}
    for r in results:
        cases.setdefault((r.kind, r.clients), {}).setdefault(r.path, []).append(r)
    rows: list[tuple[str, str]] = []
    for (kind, clients), by_path in cases.items():
        for where, view in VIEWS:
            mid: dict[str, tuple[float, float]] = {}
            for path in PATHS:
                seen = [view(r) for r in by_path.get(path, [])]
                pairs = [v for v in seen if v is not None]
                if not pairs or len(pairs) < len(seen):
                    continue
                rate = statistics.median(x for x, _ in pairs) / QUOTA
                worst = statistics.median(w for _, w in pairs) / (QUOTA * SLIDING_S)
                mid[path] = (rate, worst)
                rows.append((f"{case_name(kind, clients)}, {path}{where}: median of {len(pairs)}",
                             f"{rate:.3f}, worst {worst:.3f}x (rates "
                             f"{', '.join(f'{x / QUOTA:.3f}' for x, _ in pairs)})"))
            if len(mid) == 2:
                (k_rate, k_worst), (p_rate, p_worst) = mid["kafka"], mid["proxy"]
                gap, window_gap = p_rate / k_rate - 1, p_worst - k_worst
                within = abs(gap) <= RATE_BOUND and abs(window_gap) <= WINDOW_BOUND
                rows.append((f"{case_name(kind, clients)}{where}: proxy - Kafka",
                             f"rate {gap:+.1%}, worst {window_gap:+.3f}x: "
                             f"{'within' if within else 'outside'} {RATE_BOUND:.0%} and {WINDOW_BOUND}x"))
    return rows


def broker_quota(broker: KafkaBroker, key: str, value: int | None,
                 client_id: str = CLIENT_ID) -> None:
    """Set (or with None delete) the broker's own quota `key` for `client_id` (`bulk`)."""
    client_quota(broker.bootstrap, key, value, client_id)


def client_quota(bootstrap: str, key: str, value: int | None, client_id: str = CLIENT_ID) -> None:
    """Set (or with None delete) the quota `key` for `client_id` (`bulk`) with kafka-configs.sh at
    `bootstrap`: Kafka's broker, or the proxy (its AlterClientQuotas)."""
    entity_quota(bootstrap, ["--entity-type", "clients", "--entity-name", client_id], key, value)


def entity_quota(bootstrap: str, entity: Sequence[str], key: str, value: int | None,
                 command_config: str | None = None, settle: float = 2.0) -> None:
    """Set (or with None delete) the quota `key` of the entity that kafka-configs.sh's `entity`
    arguments name ("--entity-type", "users", "--entity-default", ...) at `bootstrap`, logged in
    with `command_config` (a properties file) if given; then wait `settle` seconds, as a broker
    applies a quota from its metadata a moment later."""
    change = ["--add-config", f"{key}={value}"] if value is not None else ["--delete-config", key]
    login = ["--command-config", command_config] if command_config else []
    out = run_tool("ConfigCommand", "--bootstrap-server", bootstrap, *login, "--alter", *entity, *change)
    if out.returncode != 0:
        raise RuntimeError(f"kafka-configs at {bootstrap} failed: {out.stdout[-500:]}{out.stderr[-1500:]}")
    time.sleep(settle)


def throttle_cb(told: list[int], by_broker: dict[int, list[int]] | None = None) -> Callable[[Any], None]:
    """A librdkafka `throttle_cb` that appends to `told` each throttle (ms) a broker or the proxy
    told the client, and to `by_broker[broker id]` where given; not the 0 ms librdkafka also
    reports when the throttling stops."""
    def throttled(event: Any) -> None:
        ms = round(event.throttle_time * 1000)
        if ms > 0:
            told.append(ms)
            if by_broker is not None:
                by_broker.setdefault(event.broker_id, []).append(ms)
    return throttled


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)


def fill(bootstrap: str, topic: str, partitions: int, megabytes: int) -> None:
    """`megabytes` MiB of 1 KiB records spread evenly over the partitions, straight to the broker."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": 1,
                  "batch.size": 1024 * 1024, "queue.buffering.max.kbytes": 65536})
    value = os.urandom(RECORD)
    for i in range(megabytes * 1024):
        while True:
            try:
                p.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    if p.flush(180):
        raise RuntimeError(f"filling {topic}: records left unacknowledged")


def read(bootstrap: str, topic: str, group: str, start: float, seconds: float, out: Timeline,
         rebalances: list[tuple[float, str]] | None = None, client_id: str = CLIENT_ID,
         config: Mapping[str, object] | None = None) -> None:
    """A member of `group` under `client_id` (`bulk`), reading from the earliest offsets: the bytes of
    the records it read, every 0.25 s; each assignment and revocation it is given goes into
    `rebalances`, with when. `config` adds to the consumer's settings (fetch sizes, a
    `throttle_cb`)."""
    c = Consumer({"bootstrap.servers": bootstrap, "client.id": client_id, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, **(config or {})})
    seen = rebalances if rebalances is not None else []

    def note(what: str) -> Callable[[Any, list[Any]], None]:
        def called(_: Any, partitions: list[Any]) -> None:
            seen.append((time.monotonic() - start,
                         f"{what} {','.join(str(tp.partition) for tp in partitions) or '-'}"))
        return called

    c.subscribe([topic], on_assign=note("assigned"), on_revoke=note("revoked"))
    done, next_mark = 0, 0.0
    try:
        while (elapsed := time.monotonic() - start) < seconds:
            for msg in c.consume(100, 0.05):
                if msg.error() is None and elapsed >= 0:
                    done += len(msg.value() or b"")
            if elapsed >= next_mark:
                out.marks.append((max(elapsed, 0.0), done))
                next_mark = max(next_mark, 0.0) + 0.25
        out.marks.append((time.monotonic() - start, done))
    finally:
        c.close()


def measure(path: str, kind: str, clients: int, bootstrap: str, topic: str, seconds: float,
            warm_up: float, batch_kib: int = 1024, client_id: str = CLIENT_ID,
            broker: str | None = None) -> Result:
    """`clients` producers (or consumers of one group) of `client_id` through `bootstrap` for
    `seconds`; for producers also what the broker at `broker` (its own address, not the proxy's;
    `bootstrap` if None) appended, and each producer's throttles and statistics."""
    start = time.monotonic() + (0.5 if kind == "produce" else 8.0)  # a group joins first
    timelines = [Timeline() for _ in range(clients)]
    rebalances: list[list[tuple[float, str]]] = [[] for _ in range(clients)]
    group = f"g-{topic}"
    work: Callable[[int], None]
    told: list[list[int]] = [[] for _ in range(clients)]  # each producer's throttles, ms
    stats: list[list[str]] = [[] for _ in range(clients)]  # and librdkafka's statistics
    if kind == "produce":
        def work(i: int) -> None:
            produce(bootstrap, topic, client_id, start, seconds, timelines[i],
                    config={"batch.size": str(batch_kib * 1024), "throttle_cb": throttle_cb(told[i]),
                            "statistics.interval.ms": 1000, "stats_cb": stats[i].append})
    else:
        def work(i: int) -> None:
            read(bootstrap, topic, group, start, seconds, timelines[i], rebalances[i], client_id)
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(clients)]
    with ExitStack() as metering:
        meter = (metering.enter_context(EndOffsets(broker or bootstrap, topic, 1, RECORD, start))
                 if kind == "produce" else None)
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(seconds + 120)

    def done(t: float) -> int:
        return sum(tl.at(t) for tl in timelines)

    since = span_start(kind, timelines, warm_up)
    if since > seconds - SLIDING_S:
        raise RuntimeError(f"{path}: the {kind} span starts at {since:.1f} s, too late for a window "
                           f"before {seconds:.0f} s (the group read its first record late?)")
    rate = (done(seconds) - done(since)) / (seconds - since)
    worst, worst_at = fullest(done, since, seconds)
    events = sorted((t, f"member {i}: {what}") for i, member in enumerate(rebalances) for t, what in member)
    out = Result(path, kind, clients, rate, worst, sum(tl.errors for tl in timelines), since,
                 worst_at, events, stalls(done, since, seconds) if kind == "consume" else [])
    if meter is not None:
        appended = meter.timeline
        out.appended = (appended.at(seconds) - appended.at(since)) / (seconds - since)
        out.appended_worst = fullest_between_readings(appended.marks, since, seconds)[0]
        every = [ms for each in told for ms in each]
        out.throttled = len(every)
        out.throttle_mean_ms = statistics.fmean(every) if every else 0.0
        counts = [client_counts(texts) for texts in stats]
        out.timeouts, out.connects, out.requests = (sum(c[i] for c in counts) for i in range(3))
    return out


def client_counts(texts: Sequence[str]) -> tuple[int, int, int]:
    """From one librdkafka client's statistics (JSON, one each interval; counters, so the last
    one's): the requests it timed out, the connections it made and the Produce requests it sent,
    over every broker it knew (the bootstrap entry's included)."""
    if not texts:
        return 0, 0, 0
    brokers = json.loads(texts[-1]).get("brokers", {}).values()
    return (sum(b.get("req_timeouts", 0) for b in brokers), sum(b.get("connects", 0) for b in brokers),
            requests_sent(brokers, "Produce"))


def requests_sent(brokers: Iterable[dict[str, Any]], api: str) -> int:
    """The requests of `api` (librdkafka's name: Produce, Fetch, ...) a librdkafka client sent to
    `brokers` (its statistics' `brokers` entries, the last interval's: counters)."""
    return sum(b.get("req", {}).get(api, 0) for b in brokers)


def stalls(done: Callable[[float], int], start: float, end: float,
           shortest: float = 2.0) -> list[tuple[float, float]]:
    """The spans of at least `shortest` seconds from `start` to `end` in which `done` (stepped
    every 0.25 s) did not grow: (from, seconds)."""
    out: list[tuple[float, float]] = []
    since, last, at = start, done(start), start
    while at <= end:
        now = done(at)
        if now != last:
            if at - 0.25 - since >= shortest:
                out.append((since, at - 0.25 - since))
            since, last = at, now
        at += 0.25
    if end - since >= shortest:
        out.append((since, end - since))
    return out


def span_start(kind: str, timelines: Sequence[Timeline], warm_up: float) -> float:
    """Where the measured span starts: `warm_up` after the start for producers; for consumers
    `warm_up` after the group's first record, wherever it joined. A group joins at its own pace
    (about 3-8 s here, differing between the two paths), and Kafka's first allowance (a window's
    worth of quota at once) is paid back a window after the first bytes: a span fixed from the
    start put part of one path's allowance in it and not the other's."""
    if kind == "produce":
        return warm_up
    first = min((t for tl in timelines for t, n in tl.marks if n > 0), default=0.0)
    return first + warm_up


def run(producers: Sequence[int] = (1, 3, 10), consumers: int = 3, paths: Sequence[str] = PATHS,
        seconds: float = 55.0, warm_up: float = SLIDING_S,
        proxy_quota: Mapping[str, object] | None = None, batch_kib: int = 1024,
        runs: int = 1) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    results: list[Result] = []
    with ExitStack() as stack:
        # Kafka's own default initial rebalance delay (devkit's brokers have none, for quick
        # tests): with none, the group formed with one member first through the proxy and with
        # all three straight to Kafka, in every round, and its members read their partitions
        # again after the rebalance.
        broker = KafkaBroker(properties_extra={"group.initial.rebalance.delay.ms": "3000"}).start()
        stack.callback(broker.close)
        proxy = ProxyProcess(broker.address, broker.node_id, extra_config={
            "quota": dict(proxy_quota or {}),
            "quotas": [{"client-id": CLIENT_ID, "producer_byte_rate": QUOTA,
                        "consumer_byte_rate": QUOTA}]}).start()
        stack.callback(proxy.stop)
        stamp = int(time.time())
        kinds = [("produce", n) for n in producers] + ([("consume", consumers)] if consumers else [])
        for round_, (kind, n) in ((i, case) for i in range(runs) for case in kinds):
            key = "producer_byte_rate" if kind == "produce" else "consumer_byte_rate"
            for path in paths:
                topic = f"many-{kind}-{n}-{path}-{stamp}-{round_}"
                partitions = 1 if kind == "produce" else n
                create_topic(broker.bootstrap, topic, partitions)
                if kind == "consume":
                    reachable = int((seconds + 2 * SLIDING_S) * QUOTA / 2**20) + 8
                    fill(broker.bootstrap, topic, partitions, reachable)
                if path == "kafka":
                    broker_quota(broker, key, QUOTA)
                try:
                    bootstrap = broker.bootstrap if path == "kafka" else proxy.bootstrap
                    result = measure(path, kind, n, bootstrap, topic, seconds, warm_up, batch_kib,
                                     broker=broker.bootstrap)
                    result.round = round_
                    results.append(result)
                finally:
                    if path == "kafka":
                        broker_quota(broker, key, None)
    for r in results:
        name = f"{case_name(r.kind, r.clients)}, {r.path}" + (f", run {r.round + 1}" if runs > 1 else "")
        rows.append((f"{name}: average / quota, {r.since:.1f}-{seconds:.0f} s", f"{r.rate / QUOTA:.3f}"))
        worst = r.worst_window / (QUOTA * SLIDING_S)
        rows.append((f"{name}: worst {SLIDING_S:.0f} s window", f"{worst:.3f}x from {r.worst_at:.1f} s"))
        if r.appended is not None and r.appended_worst is not None:
            rows.append((f"{name}: at the broker, average, worst",
                         f"{r.appended / QUOTA:.3f}, {r.appended_worst / (QUOTA * SLIDING_S):.3f}x"))
            rows.append((f"{name}: the clients' throttles, timeouts",
                         f"{r.throttled} throttled (mean {r.throttle_mean_ms:.0f} ms), "
                         f"{r.requests} Produce requests, {r.timeouts} timed out, {r.connects} connections"))
        if r.kind == "consume":
            rows.append((f"{name}: stalls of 2 s or more in the span",
                         ", ".join(f"{d:.1f} s from {t:.1f} s" for t, d in r.stalls) or "none"))
            rows.append((f"{name}: assignments and revocations",
                         "; ".join(f"{t:.1f} s {what}" for t, what in r.rebalances) or "none"))
        if r.errors:
            rows.append((f"{name}: delivery errors", str(r.errors)))
    if runs > 1:
        rows.extend(medians(results))
    rows.append(("load average at the end", " ".join(f"{x:.1f}" for x in os.getloadavg())))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.many_connections")
    ap.add_argument("--producers", type=int, nargs="*", default=[1, 3, 10])
    ap.add_argument("--consumers", type=int, default=3, help="consumers of one group; 0: none")
    ap.add_argument("--paths", nargs="*", default=list(PATHS), choices=PATHS)
    ap.add_argument("--seconds", type=float, default=55.0)
    ap.add_argument("--warm-up", type=float, default=SLIDING_S)
    ap.add_argument("--batch-kib", type=int, default=1024,
                    help="the producers' batch.size, KiB (librdkafka's default: 1024)")
    ap.add_argument("--proxy-quota", nargs="*", default=[], metavar="KEY=VALUE",
                    help="settings under the proxy's `quota:` (e.g. a quota enforcement mode)")
    ap.add_argument("--runs", type=int, default=1,
                    help="run every case this many times, and print the medians (default 1)")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs takes a number of at least 1")
    for name, value in run(args.producers, args.consumers, args.paths, args.seconds, args.warm_up,
                           settings(args.proxy_quota, "--proxy-quota"), args.batch_kib, args.runs):
        print(f"{name:55s} {value}", flush=True)


if __name__ == "__main__":
    main()
