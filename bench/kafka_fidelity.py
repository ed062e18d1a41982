"""Kafka-exact, side by side (issue 36): the same quota and workload (a) straight to a Kafka 4.4
broker that enforces the quota itself and (b) through the proxy enforcing it in front of the same
broker with none, the two paths one after the other in each round, every case `--runs` rounds.

Both quotas are set the same way, with Kafka's own `kafka-configs.sh` (ConfigCommand): at the
broker for (a), at the proxy (its AlterClientQuotas; ANONYMOUS from loopback may) for (b); each is
deleted after its run.

Cases (`--cases`), each under a `producer_byte_rate` of 1,000,000 B/s for client-id `bulk`:
- `java-producer-1k`, `java-producer-16k`: Kafka's `kafka-producer-perf-test` (ProducerPerformance)
  with `--throughput -1`, 1 KiB and 16 KiB records, the tool's defaults otherwise (acks=all,
  linger 5 ms, 16 KiB batches), as many records as `--seconds` of 1.1x the quota;
- `librdkafka-producer`: a librdkafka producer flat out for `--seconds` (1 KiB records, 128 KiB
  batches, linger 5 ms, acks=1, a 4 MiB queue: devkit.producing's).

For each case and path:
- rate: the record bytes the broker appended (its end offsets, read every 0.25 s straight from the
  broker, times the record size), over whole 11 s windows from `--warm-up` after the first byte
  (Kafka's first allowance paid back) to the last whole one before the last byte;
- worst: the most in any sliding 11 s window over the same span;
- throttled: the responses that told the client to wait and their mean throttle time, as the
  client saw them (the Java client's NetworkClient logs each at TRACE, "Connection to node N is
  throttled for T ms"; librdkafka calls `throttle_cb`), and for the Java tool its own
  `produce-throttle-time-avg` and `-max` (`--print-metrics`).

With the rounds, each path's medians and the proxy's gap from Kafka's broker, against the bounds:
rate within 3%, worst window within 0.05x of the quota's worth, the mean throttle within 15%.

    python -m bench.kafka_fidelity                      # every case, three rounds
    python -m bench.kafka_fidelity --cases java-producer-1k --runs 5
    make bench BENCH=kafka_fidelity

Printed, never asserted: docs/differences-from-kafka.md holds the measured table. Kafka, the
proxy and the clients share this machine's cores.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.many_connections import CLIENT_ID, QUOTA, RATE_BOUND, WINDOW_BOUND, create_topic
from bench.shared_accuracy import SLIDING_S, fullest
from devkit.kafka import QUIET_LOG4J2, KafkaBroker, java_command, lib_dir, run_tool
from devkit.processes import ProxyProcess
from devkit.producing import RECORD, Timeline, produce

PATHS = ("kafka", "proxy")
THROTTLE_BOUND = 0.15  # the proxy's median mean throttle within 15% of Kafka's
OVERRUN = 1.1  # a Java producer is given records for `seconds` at this many times the quota

# The tools' quiet config, and the one NetworkClient line a throttled response writes.
TRACE_NETWORK_LOG4J2 = QUIET_LOG4J2 + (
    "logger.network.name = org.apache.kafka.clients.NetworkClient\n"
    "logger.network.level = TRACE\n")
THROTTLED = re.compile(r"Connection to node -?\d+ is throttled for (\d+) ms")
METRIC = re.compile(r"^([\w-]+):([\w.-]+):\{([^}]*)\}\s*:\s*(\S+)\s*$")


@dataclass(frozen=True)
class Case:
    client: str  # "java" (kafka-producer-perf-test) or "librdkafka"
    record: int  # bytes of each record's value


CASES = {
    "java-producer-1k": Case("java", 1024),
    "java-producer-16k": Case("java", 16 * 1024),
    "librdkafka-producer": Case("librdkafka", RECORD),
}


@dataclass
class Outcome:
    """One path's run of one case."""

    case: str
    path: str
    round: int = 0
    rate: float | None = None  # bytes/s over whole windows, measured at the broker
    worst: float | None = None  # bytes in the fullest sliding 11 s window of that span
    span: tuple[float, float] | None = None  # seconds after the start
    throttles: list[int] = field(default_factory=list)  # ms, each response that throttled
    metrics: dict[str, float] = field(default_factory=dict)  # the Java tool's --print-metrics
    errors: list[str] = field(default_factory=list)

    @property
    def mean_throttle(self) -> float | None:
        return statistics.fmean(self.throttles) if self.throttles else None


# -- reading what the clients say ---------------------------------------------------------------------

def throttles(text: str) -> list[int]:
    """The throttle time (ms) of each response a Java client logged as throttling it (at TRACE,
    TRACE_NETWORK_LOG4J2)."""
    return [int(m.group(1)) for m in THROTTLED.finditer(text)]


def client_metrics(text: str) -> dict[str, float]:
    """`--print-metrics` lines ("group:name:{tags} : value") as {"group:name": value}; where a
    metric is printed for several tag sets (one per node, say), the largest. NaN (a sensor with no
    value yet) is left out."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        m = METRIC.match(line.strip())
        if m is None:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        if value != value:
            continue
        key = f"{m.group(1)}:{m.group(2)}"
        found[key] = max(found.get(key, value), value)
    return found


# -- measuring at the broker --------------------------------------------------------------------------

class EndOffsets:
    """The topic's end offsets summed over its partitions, read straight from the broker every
    0.25 s from `start` (time.monotonic) until stopped, times `record` bytes: what the broker
    appended, whoever enforced the quota. Its own client-id has no quota."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, record: int, start: float) -> None:
        self.timeline = Timeline()
        self._stop = threading.Event()
        self._args = (bootstrap, topic, partitions, record, start)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> EndOffsets:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        bootstrap, topic, partitions, record, start = self._args
        c = Consumer({"bootstrap.servers": bootstrap, "client.id": "fidelity-meter",
                      "group.id": "fidelity-meter", "enable.auto.commit": False})
        marks = self.timeline.marks
        at = 0.0
        try:
            while not self._stop.is_set():
                wait = start + at - time.monotonic()
                if wait > 0:
                    self._stop.wait(wait)
                elapsed = time.monotonic() - start
                try:
                    ends = sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=2,
                                                       cached=False)[1] for p in range(partitions))
                except Exception:  # a slow answer: the next reading counts it
                    self.timeline.errors += 1
                else:
                    marks.append((elapsed, ends * record))
                at = max(at + 0.25, elapsed - elapsed % 0.25)
        finally:
            c.close()


def judge(timeline: Timeline, out: Outcome, warm_up: float) -> Outcome:
    """The rate over whole SLIDING_S windows from `warm_up` after the first byte to the last whole
    one before the last byte, and the fullest sliding window of that span."""
    marks = timeline.marks
    moving = [t for t, n in marks if n > 0]
    if not moving:
        out.errors.append("the broker appended nothing")
        return out
    final = marks[-1][1]
    last = next(t for t, n in marks if n >= final)
    start = moving[0] + warm_up
    windows = int((last - start) // SLIDING_S)
    if windows < 1:
        out.errors.append(f"{last - moving[0]:.1f} s from the first byte to the last: no whole "
                          f"{SLIDING_S:.0f} s window after the {warm_up:.0f} s warm-up")
        return out
    end = start + windows * SLIDING_S
    out.span = (start, end)
    out.rate = (timeline.at(end) - timeline.at(start)) / (end - start)
    out.worst = fullest(timeline.at, start, end)[0]
    return out


# -- the workloads ------------------------------------------------------------------------------------

def java_produce(bootstrap: str, topic: str, record: int, records: int, timeout: float,
                 out: Outcome) -> None:
    """kafka-producer-perf-test, flat out, `records` of `record` bytes under client-id `bulk`: its
    throttled responses and metrics into `out`."""
    with tempfile.TemporaryDirectory(prefix="kafka-fidelity-") as scratch:
        log4j = Path(scratch, "log4j2.properties")
        log4j.write_text(TRACE_NETWORK_LOG4J2)
        cmd = java_command("org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
                           "--num-records", str(records), "--record-size", str(record),
                           "--throughput", "-1", "--print-metrics", "--producer-props",
                           f"bootstrap.servers={bootstrap}", f"client.id={CLIENT_ID}",
                           lib=lib_dir(None), log4j=log4j)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            out.errors.append(f"kafka-producer-perf-test ran over {timeout:.0f} s")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            out.throttles = throttles(err)
            return
    out.throttles = throttles(done.stderr)
    out.metrics = {k.split(":", 1)[1]: v for k, v in client_metrics(done.stdout).items()
                   if k.startswith("producer-metrics:produce-throttle-time")}
    if done.returncode != 0:
        out.errors.append(f"kafka-producer-perf-test exited {done.returncode}: "
                          f"{done.stderr.strip().splitlines()[-1:] or done.stdout[-300:]}")


def rdkafka_produce(bootstrap: str, topic: str, seconds: float, start: float, out: Outcome) -> None:
    """devkit.producing's librdkafka producer flat out for `seconds` from `start`, each throttle
    it was told into `out`."""
    told: list[int] = []

    def throttled(event: Any) -> None:
        ms = round(event.throttle_time * 1000)
        if ms > 0:  # librdkafka also says when a broker stops throttling it (0 ms)
            told.append(ms)

    timeline = Timeline()
    produce(bootstrap, topic, CLIENT_ID, start, seconds, timeline, config={"throttle_cb": throttled})
    out.throttles = told
    if timeline.errors:
        out.errors.append(f"{timeline.errors} records not delivered")


def quota(bootstrap: str, value: int | None) -> None:
    """Set (or with None delete) `producer_byte_rate` for client-id `bulk` with kafka-configs.sh at
    `bootstrap`: Kafka's broker, or the proxy."""
    change = (["--add-config", f"producer_byte_rate={value}"] if value is not None
              else ["--delete-config", "producer_byte_rate"])
    done = run_tool("ConfigCommand", "--bootstrap-server", bootstrap, "--alter",
                    "--entity-type", "clients", "--entity-name", CLIENT_ID, *change)
    if done.returncode != 0:
        raise RuntimeError(f"kafka-configs at {bootstrap} failed: {done.stdout[-500:]}{done.stderr[-1500:]}")
    time.sleep(2)  # a broker applies a client quota from its metadata a moment later


def measure(name: str, path: str, broker: KafkaBroker, bootstrap: str, topic: str,
            seconds: float, warm_up: float) -> Outcome:
    case = CASES[name]
    out = Outcome(name, path)
    start = time.monotonic() + 0.5
    with EndOffsets(broker.bootstrap, topic, 1, case.record, start) as meter:
        if case.client == "java":
            records = int(seconds * QUOTA * OVERRUN / case.record)
            java_produce(bootstrap, topic, case.record, records, seconds * 3 + 60, out)
        else:
            rdkafka_produce(bootstrap, topic, seconds, start, out)
        time.sleep(0.5)  # the last acknowledged bytes' offsets
    if meter.timeline.errors:
        out.errors.append(f"{meter.timeline.errors} end-offset readings failed")
    return judge(meter.timeline, out, warm_up)


# -- the table -----------------------------------------------------------------------------------------

def rows_of(r: Outcome) -> list[tuple[str, str]]:
    name = f"{r.case}, {r.path}, run {r.round + 1}"
    rows = []
    if r.rate is not None and r.worst is not None and r.span is not None:
        rows.append((f"{name}: rate / quota, {r.span[0]:.1f}-{r.span[1]:.1f} s",
                     f"{r.rate / QUOTA:.3f}, worst {r.worst / (QUOTA * SLIDING_S):.3f}x"))
    mean = r.mean_throttle
    told = f"{len(r.throttles)} throttled" + (f", mean {mean:.0f} ms" if mean is not None else "")
    if r.metrics:
        told += ", the tool's " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.metrics.items()))
    rows.append((f"{name}: throttles told", told))
    if r.errors:
        rows.append((f"{name}: errors", "; ".join(r.errors)))
    return rows


def medians(results: Sequence[Outcome]) -> list[tuple[str, str]]:
    """Each case's medians per path over its measured runs (rate, worst window, mean throttle), then
    the proxy's gap from Kafka's broker where both have runs, against the bounds."""
    by_case: dict[str, dict[str, list[Outcome]]] = {}
    for r in results:
        if r.rate is not None and r.worst is not None:
            by_case.setdefault(r.case, {}).setdefault(r.path, []).append(r)
    rows: list[tuple[str, str]] = []
    for case, by_path in by_case.items():
        mid: dict[str, tuple[float, float, float | None]] = {}
        for path in PATHS:
            runs = by_path.get(path)
            if not runs:
                continue
            rate = statistics.median(r.rate for r in runs if r.rate is not None) / QUOTA
            worst = statistics.median(r.worst for r in runs if r.worst is not None) / (QUOTA * SLIDING_S)
            means = [m for r in runs if (m := r.mean_throttle) is not None]
            throttle = statistics.median(means) if means else None
            mid[path] = (rate, worst, throttle)
            rows.append((f"{case}, {path}: median of {len(runs)}",
                         f"{rate:.3f}, worst {worst:.3f}x, mean throttle "
                         f"{'-' if throttle is None else f'{throttle:.0f} ms'} (rates "
                         f"{', '.join(f'{r.rate / QUOTA:.3f}' for r in runs if r.rate is not None)})"))
        if len(mid) == 2:
            rows.append((f"{case}: proxy - Kafka", gap(mid["kafka"], mid["proxy"])))
    return rows


def gap(kafka: tuple[float, float, float | None], proxy: tuple[float, float, float | None]) -> str:
    """The proxy's medians against Kafka's: rate (relative), worst window (in the quota's worth),
    mean throttle (relative), and whether all three are within the bounds."""
    rate_gap, window_gap = proxy[0] / kafka[0] - 1, proxy[1] - kafka[1]
    within = abs(rate_gap) <= RATE_BOUND and abs(window_gap) <= WINDOW_BOUND
    text = f"rate {rate_gap:+.1%}, worst {window_gap:+.3f}x"
    if kafka[2] and proxy[2] is not None:
        throttle_gap = proxy[2] / kafka[2] - 1
        within = within and abs(throttle_gap) <= THROTTLE_BOUND
        text += f", mean throttle {throttle_gap:+.1%}"
    else:
        within = False
        text += ", mean throttle not compared (no throttles on a path)"
    bounds = f"{RATE_BOUND:.0%}, {WINDOW_BOUND}x, {THROTTLE_BOUND:.0%}"
    return f"{text}: {'within' if within else 'outside'} {bounds}"


def run(cases: Sequence[str] = tuple(CASES), runs: int = 3, paths: Sequence[str] = PATHS,
        seconds: float = 55.0, warm_up: float = SLIDING_S) -> list[tuple[str, str]]:
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    results: list[Outcome] = []
    rows: list[tuple[str, str]] = []
    with ExitStack() as stack:
        broker = KafkaBroker().start()
        stack.callback(broker.stop)
        proxy = ProxyProcess(broker.address, broker.node_id).start()
        stack.callback(proxy.stop)
        stamp = int(time.time())
        for round_ in range(runs):
            for name in cases:
                for path in paths:
                    topic = f"fidelity-{name}-{path}-{stamp}-{round_}"
                    create_topic(broker.bootstrap, topic, 1)
                    bootstrap = broker.bootstrap if path == "kafka" else proxy.bootstrap
                    quota(bootstrap, QUOTA)
                    try:
                        out = measure(name, path, broker, bootstrap, topic, seconds, warm_up)
                    finally:
                        quota(bootstrap, None)
                    out.round = round_
                    results.append(out)
                    # as it goes, on standard error: a round of every case takes minutes
                    print(*(f"{k:60s} {v}" for k, v in rows_of(out)), sep="\n", file=sys.stderr,
                          flush=True)
    for r in results:
        rows.extend(rows_of(r))
    rows.extend(medians(results))
    rows.append(("load average at the end", " ".join(f"{x:.1f}" for x in os.getloadavg())))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_fidelity")
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--runs", type=int, default=3, help="rounds of every case (default 3)")
    ap.add_argument("--paths", nargs="*", default=list(PATHS), choices=PATHS)
    ap.add_argument("--seconds", type=float, default=55.0,
                    help="how long a run lasts (a Java producer: records for this long at 1.1x)")
    ap.add_argument("--warm-up", type=float, default=SLIDING_S)
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs takes a number of at least 1")
    for name, value in run(args.cases, args.runs, args.paths, args.seconds, args.warm_up):
        print(f"{name:60s} {value}", flush=True)


if __name__ == "__main__":
    main()
