"""How closely proxy replicas sharing one Valkey hold one producer quota, and one consumer
quota, together.

R proxy processes (`store:` on one real Valkey, `quota.scope: cluster`) in front of one Tansu;
one librdkafka producer per replica, all with the client-id that has a 1 MiB/s
`producer_byte_rate`; then the same with one librdkafka consumer per replica, each reading a
partition filled beforehand from its start, under a 1 MiB/s `consumer_byte_rate`. Three traffic
shapes:

- even: every producer flat out;
- skewed: one producer flat out (the hot replica), the others at 5% of the quota each;
- shifting: one producer flat out at a time, the hot spot moving to the next replica every 10 s.

The producers' acknowledged bytes (for consumers, the Fetch response bytes each replica sent its
consumer, which is what a consumer quota counts), summed across replicas every 0.25 s, give the
aggregate rate
over the measured period (after a warm-up that lets the first burst, which Kafka's rate allows a
new client, be paid back) and the largest sum in any sliding 11 s window. Targets (issue 14):
the aggregate within 5% of the quota, no 11 s window over 1.3 times the quota's worth.

    python -m bench.shared_accuracy                      # 3 and 10 replicas, 75 s per shape, both kinds
    python -m bench.shared_accuracy --replicas 2 --seconds 20 --warm-up 10   # a quick look
    python -m bench.shared_accuracy --kinds consume --batch-kib 64   # finer fetches

The same demand through fewer replicas, another enforcement, or `--workers`: `--clients N` runs N
clients spread over the replicas in turn (client i through replica i mod R; by default one a
replica), `--set KEY=VALUE` adds settings under each replica's `quota:`, and `--workers N` runs
each replica with N workers:

    python -m bench.shared_accuracy --replicas 1 --clients 3 --shapes even   # one replica alone
    python -m bench.shared_accuracy --replicas 3 --shapes even --set byte_rate_enforcement=paced
    python -m bench.shared_accuracy --replicas 1 --workers 2 --clients 3 --shapes even

Each run also reports what its replicas saw (`traffic`): the requests of its kind, their mean time
at the broker, how many were throttled and for how long on average, and the syncs with the store
and their mean time.

Producers send batches of up to 128 KiB; `--produce-batch-kib 1024` gives librdkafka's own
default, issue 27's workload.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Protocol

import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit.processes import ProxyProcess
from devkit.producing import Timeline, consume, fill, produce, start_replicas
from devkit.tansu import Broker
from devkit.valkey import ValkeyServer

MIB = 1024 * 1024
QUOTA = MIB
CLIENT_ID = "shared-tenant"
SLIDING_S = 11.0
PREFIX = "kafka_quota_proxy_"
SHAPES = ("even", "skewed", "shifting")
KINDS = ("produce", "consume")  # a producer quota, then a consumer quota


def _pace(shape: str, index: int, replicas: int) -> Callable[[float], float | None]:
    """Bytes/s producer `index` may send at each moment (None: flat out; 0: idle)."""
    def pace(elapsed: float) -> float | None:
        if shape == "even":
            return None
        if shape == "skewed":
            return None if index == 0 else 0.05 * QUOTA
        hot = int(elapsed // 10) % replicas
        return None if index == hot else 0.0
    return pace


@dataclass
class Result:
    replicas: int
    shape: str
    clients: int
    rate: float  # bytes/s over the measured period
    worst_window: float  # bytes in the fullest sliding 11 s window
    errors: int
    store_errors: int  # failed syncs, all replicas
    degradations: int  # times a replica went degraded
    # What the replicas saw, summed over them (`traffic`): the Fetch or Produce requests, their
    # mean time at the broker, those throttled and for how long, and the syncs and their mean time.
    seen: dict[str, float] = field(default_factory=dict)
    # Producers: the Produce bytes the replicas read and sent on, over the same period and its
    # fullest window (`_read_bytes`), what the quota charged; None for consumers.
    read_rate: float | None = None
    read_worst_window: float | None = None
    worst_at: float = 0.0  # where the fullest window starts, seconds from the clients' start


def fullest(done: Callable[[float], int], start: float, end: float) -> tuple[int, float]:
    """The most bytes in any sliding SLIDING_S window from `start` to `end` (seconds), stepped
    every 0.25 s, and where the first window holding that many starts; `done(t)` is the bytes
    counted by time t."""
    worst, worst_at, at = 0, start, start
    while at + SLIDING_S <= end:
        n = done(at + SLIDING_S) - done(at)
        if n > worst:
            worst, worst_at = n, at
        at += 0.25
    return worst, worst_at


def fullest_between_readings(marks: Sequence[tuple[float, int]], start: float,
                             end: float) -> tuple[int, float]:
    """The most bytes counted between two readings of `marks` ((seconds, bytes so far), in time
    order) no more than SLIDING_S apart, both within `start`..`end`, and the first such pair's
    first reading's time. Those bytes all came within one window, so this never counts more than
    the fullest window held, and less by at most what came in one reading interval at each end.

    `fullest` steps a window over the readings instead, and counts from the last reading at or
    before each step: that reading can be up to an interval before the window, so for a client
    that sends bursts about a window apart (`kafka-producer-perf-test` under Kafka's throttle),
    one window can count the tail of one burst and the head of the next. It flipped a run's
    fullest window between 0.995x and 1.276x when its readings, 0.25 s apart, moved 0.4 ms."""
    within = [(t, n) for t, n in marks if start <= t <= end]
    worst, worst_at, j = 0, start, 0
    for i, (t, n) in enumerate(within):
        j = max(j, i)
        while j + 1 < len(within) and within[j + 1][0] - t <= SLIDING_S:
            j += 1
        if within[j][1] - n > worst:
            worst, worst_at = within[j][1] - n, t
    return worst, worst_at


def fullest_window(done: Callable[[float], int], start: float, end: float) -> int:
    """The bytes of `fullest`'s window."""
    return fullest(done, start, end)[0]


def _fetched_bytes(proxies: Sequence[ProxyProcess], start: float, out: list[Timeline],
                   done: threading.Event) -> None:
    """Each replica's Fetch response bytes sent to its one consumer, every 0.25 s from `start`:
    what a consumer quota counts. The records a consumer reads are fewer: a paced consumer
    pauses its partition, and librdkafka drops what it had fetched for it and fetches it again
    on resume, so the same bytes are fetched (and counted) more than once."""
    _counted_bytes(proxies, "kafka_quota_proxy_response_bytes_total", "Fetch", start, out, done)


def _read_bytes(proxies: Sequence[ProxyProcess], start: float, out: list[Timeline],
                done: threading.Event) -> None:
    """Each replica's Produce request bytes read from its clients (and sent on to the broker),
    every 0.25 s from `start`: what a producer quota charges, acknowledged or not. A librdkafka
    producer whose request waited 60 s for its answer closes its connection and sends its
    records again; a request of it that the proxy had already read reached the broker, and was
    charged, but is never acknowledged, so the acknowledged rate falls short of it."""
    _counted_bytes(proxies, "kafka_quota_proxy_request_bytes_total", "Produce", start, out, done)


def _counted_bytes(proxies: Sequence[ProxyProcess], metric: str, api: str, start: float,
                   out: list[Timeline], done: threading.Event) -> None:
    base = [p.metric(metric, api=api) for p in proxies]
    while not done.is_set():
        elapsed = time.monotonic() - start
        for p, b, tl in zip(proxies, base, out, strict=True):
            tl.marks.append((elapsed, int(p.metric(metric, api=api) - b)))
        done.wait(0.25)


class Scraped(Protocol):
    """What `traffic` reads of a replica: its Prometheus text."""

    def metrics(self) -> str: ...


def traffic(proxies: Sequence[Scraped], kind: str) -> dict[str, float]:
    """What the replicas saw of the run, summed over them: the requests of `kind`'s API, their
    mean time at the broker (ms), the throttled ones and their mean throttle (ms), and the syncs
    with the store and their mean time (ms). Where a fleet loses rate against one replica, these
    say whether its requests were throttled more, or waited longer, or its syncs were slow."""
    api = "Produce" if kind == "produce" else "Fetch"
    quota_type = "produce" if kind == "produce" else "fetch"
    sums: dict[str, float] = {}

    def add(name: str, value: float) -> None:
        sums[name] = sums.get(name, 0.0) + value

    for p in proxies:
        for family in text_string_to_metric_families(p.metrics()):
            for sample in family.samples:
                labels = sample.labels
                if labels.get("api") == api and sample.name in (
                        f"{PREFIX}requests_total", f"{PREFIX}upstream_latency_seconds_sum",
                        f"{PREFIX}upstream_latency_seconds_count"):
                    add(sample.name, sample.value)
                elif labels.get("quota_type") == quota_type and sample.name in (
                        f"{PREFIX}throttled_requests_total", f"{PREFIX}throttle_time_ms_total"):
                    add(sample.name, sample.value)
                elif sample.name in (f"{PREFIX}store_sync_duration_seconds_sum",
                                     f"{PREFIX}store_sync_duration_seconds_count"):
                    add(sample.name, sample.value)

    def ratio(top: str, bottom: str, scale: float = 1.0) -> float:
        below = sums.get(PREFIX + bottom, 0.0)
        return sums.get(PREFIX + top, 0.0) * scale / below if below else 0.0

    return {"requests": sums.get(f"{PREFIX}requests_total", 0.0),
            "broker ms": ratio("upstream_latency_seconds_sum", "upstream_latency_seconds_count", 1e3),
            "throttled": sums.get(f"{PREFIX}throttled_requests_total", 0.0),
            "throttle ms": ratio("throttle_time_ms_total", "throttled_requests_total"),
            "syncs": sums.get(f"{PREFIX}store_sync_duration_seconds_count", 0.0),
            "sync ms": ratio("store_sync_duration_seconds_sum", "store_sync_duration_seconds_count",
                             1e3)}


def fleet_config(valkey_url: str, prefix: str, kind: str, quota: Mapping[str, object] | None = None,
                 workers: int = 1, store: Mapping[str, object] | None = None) -> dict[str, object]:
    """Each replica's settings: the one client-id's quota of `kind`, enforced fleet-wide through
    the store; `quota` adds settings under `quota:` (an enforcement mode, say), `store` under
    `store:` (its `sync_interval_ms`, say)."""
    key = "producer_byte_rate" if kind == "produce" else "consumer_byte_rate"
    config: dict[str, object] = {"quota": {"scope": "cluster", **(quota or {})},
                                 "quotas": [{"client-id": CLIENT_ID, key: QUOTA}],
                                 "store": {"url": valkey_url, "key_prefix": prefix, **(store or {})}}
    if workers > 1:
        config["workers"] = workers
    return config


def replica_of(client: int, replicas: int) -> int:
    """The replica client `client` goes through: the clients spread over the replicas in turn."""
    return client % replicas


def run_shape(broker: Broker, node_id: int, valkey: ValkeyServer, replicas: int, shape: str,
              seconds: float, warm_up: float, kind: str = "produce", batch_kib: int = 1024,
              clients: int | None = None, quota: Mapping[str, object] | None = None,
              workers: int = 1, produce_batch_kib: int = 128,
              store: Mapping[str, object] | None = None) -> Result:
    """One run: `clients` clients (one a replica by default) of the one client-id through
    `replicas` replicas of `workers` workers each."""
    clients = replicas if clients is None else clients
    prefix = f"acc{replicas}x{workers}c{clients}{shape}{kind}{int(time.time())}"
    config = fleet_config(valkey.url, prefix, kind, quota, workers, store)
    with ExitStack() as stack:
        topic = f"acc-{prefix}"
        proxies = start_replicas(stack, broker.address, node_id, replicas, config, topic)
        total = warm_up + seconds
        if kind == "consume":
            # Each reader reads the partition from its start on its own: more than any can reach
            # (the quota's worth over the run, and a new client's first burst, a window's worth).
            fill(broker.address, topic, int((total + 2 * SLIDING_S) * QUOTA / MIB), batch_kib * 1024)
        start = time.monotonic() + 0.5
        timelines = [Timeline() for _ in range(clients)]
        work = produce if kind == "produce" else consume
        # A producer's batch.size (devkit's 128 KiB by default; librdkafka's own is 1 MB).
        options = {"config": {"batch.size": produce_batch_kib * 1024}} if kind == "produce" else {}
        threads = [threading.Thread(target=work, daemon=True, args=(
            proxies[replica_of(i, replicas)].bootstrap, topic, CLIENT_ID, start, total,
            timelines[i], _pace(shape, i, clients)), kwargs=options) for i in range(clients)]
        # What the quota counts of a consumer; of a producer, what it charged (`_read_bytes`).
        at_replicas = [Timeline() for _ in proxies]
        done = threading.Event()
        threads.append(threading.Thread(target=_fetched_bytes if kind == "consume" else _read_bytes,
                                        daemon=True, args=(proxies, start, at_replicas, done)))
        for thread in threads:
            thread.start()
        for thread in threads[:clients]:
            thread.join(total + 120)
        done.set()
        for thread in threads[clients:]:
            thread.join(10)
        # How often the replicas could not sync in time (each failure leaves the others' bytes
        # one more interval late; two in a row degrade the replica to its local share).
        store_errors = sum(int(p.metric("kafka_quota_proxy_store_errors_total")) for p in proxies)
        degradations = sum(p.log_text().count("enforced as this replica's share") for p in proxies)
        seen = traffic(proxies, kind)

    counted = at_replicas if kind == "consume" else timelines

    def acked(t: float) -> int:
        return sum(tl.at(t) for tl in counted)

    def read(t: float) -> int:
        return sum(tl.at(t) for tl in at_replicas)

    rate = (acked(total) - acked(warm_up)) / seconds
    worst, worst_at = fullest(acked, warm_up, total)
    result = Result(replicas, shape, clients, rate, worst, sum(tl.errors for tl in timelines),
                    store_errors, degradations, seen, worst_at=worst_at)
    if kind == "produce":
        result.read_rate = (read(total) - read(warm_up)) / seconds
        result.read_worst_window = fullest_window(read, warm_up, total)
    return result


def run(fleets: Sequence[int] = (3, 10), shapes: Sequence[str] = SHAPES, seconds: float = 60.0,
        warm_up: float = 15.0, kinds: Sequence[str] = KINDS, batch_kib: int = 1024,
        clients: int | None = None, quota: Mapping[str, object] | None = None,
        workers: int = 1, produce_batch_kib: int = 128,
        store: Mapping[str, object] | None = None) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    with ExitStack() as stack:
        broker = Broker().start()
        stack.callback(broker.stop)
        valkey = ValkeyServer().start()
        stack.callback(valkey.stop)
        node_id = broker.node_id()
        for kind in kinds:
            for replicas in fleets:
                for shape in shapes:
                    r = run_shape(broker, node_id, valkey, replicas, shape, seconds, warm_up, kind,
                                  batch_kib, clients, quota, workers, produce_batch_kib, store)
                    name = run_name(kind, replicas, workers, r.clients, shape)
                    rows.append((f"{name}: aggregate over {seconds:.0f} s",
                                 f"{r.rate / MIB:.3f} MiB/s ({r.rate / QUOTA - 1:+.1%})"))
                    rows.append((f"{name}: fullest {SLIDING_S:.0f} s window",
                                 f"{r.worst_window / (QUOTA * SLIDING_S):.2f}x the quota's worth "
                                 f"(from {r.worst_at:.1f} s)"))
                    if r.read_rate is not None and r.read_worst_window is not None:
                        rows.append((f"{name}: read by the replicas over {seconds:.0f} s",
                                     f"{r.read_rate / MIB:.3f} MiB/s ({r.read_rate / QUOTA - 1:+.1%}), "
                                     f"fullest {SLIDING_S:.0f} s window "
                                     f"{r.read_worst_window / (QUOTA * SLIDING_S):.2f}x"))
                    rows.append((f"{name}: failed syncs, degradations",
                                 f"{r.store_errors}, {r.degradations}"))
                    rows.append((f"{name}: seen", ", ".join(
                        f"{k} {v:.0f}" if v >= 100 else f"{k} {v:.1f}" for k, v in r.seen.items())))
                    if r.errors:
                        rows.append((f"{name}: delivery errors", str(r.errors)))
    rows.append(("load average at the end", " ".join(f"{x:.1f}" for x in os.getloadavg())))
    return rows


def run_name(kind: str, replicas: int, workers: int, clients: int, shape: str) -> str:
    fleet = f"{replicas} replica{'s' if replicas > 1 else ''}"
    if workers > 1:
        fleet += f" of {workers} workers"
    if clients != replicas:
        fleet += f", {clients} clients"
    return f"{kind}, {fleet}, {shape}"


def settings(items: Sequence[str], flag: str = "--set", under: str = "quota:") -> dict[str, object]:
    """`KEY=VALUE` items (of the option `flag`) as settings `under` a section; a clear error for
    one without `=`."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} {item!r}: expected KEY=VALUE (a setting under {under})")
        out[key] = yaml.safe_load(value)  # as the config file would read it: 100 is a number
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.shared_accuracy")
    ap.add_argument("--replicas", type=int, nargs="*", default=[3, 10])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=SHAPES)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warm-up", type=float, default=15.0)
    ap.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    ap.add_argument("--batch-kib", type=int, default=1024,
                    help="the size of the batches a consumer's partition is filled with, KiB: a "
                         "fetch brings whole batches, so this sets how coarse its all-or-nothing is")
    ap.add_argument("--produce-batch-kib", type=int, default=128,
                    help="a producer's batch.size, KiB (default 128; librdkafka's own is 1024)")
    ap.add_argument("--clients", type=int, default=None,
                    help="clients of the one client-id, spread over the replicas in turn "
                         "(default: one a replica)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", dest="quota",
                    help="settings under each replica's `quota:` (byte_rate_enforcement=paced, say)")
    ap.add_argument("--store-set", nargs="*", default=[], metavar="KEY=VALUE", dest="store",
                    help="settings under each replica's `store:` (sync_interval_ms=20, say)")
    ap.add_argument("--workers", type=int, default=1, help="workers of each replica (default 1)")
    args = ap.parse_args()
    if args.clients is not None and args.clients < 1 or args.workers < 1:
        ap.error("--clients and --workers take a number of at least 1")
    for name, value in run(args.replicas, args.shapes, args.seconds, args.warm_up, args.kinds,
                           args.batch_kib, args.clients, settings(args.quota), args.workers,
                           args.produce_batch_kib, settings(args.store, "--store-set", "store:")):
        print(f"{name:55s} {value}")


if __name__ == "__main__":
    main()
