"""Kafka-exact, side by side (issue 36): the same quota and workload (a) straight to a Kafka 4.4
broker that enforces the quota itself and (b) through the proxy enforcing it in front of the same
broker with none, the two paths one after the other in each round, every case `--runs` rounds.

Both quotas are set the same way, with Kafka's own `kafka-configs.sh` (ConfigCommand): at the
broker for (a), at the proxy (its AlterClientQuotas; ANONYMOUS from loopback may) for (b); each is
deleted after its run.

Cases (`--cases`), each under a quota of 1,000,000 B/s for client-id `bulk`:
- `java-producer-1k`, `java-producer-16k` (`producer_byte_rate`): Kafka's
  `kafka-producer-perf-test` (ProducerPerformance) with `--throughput -1`, 1 KiB and 16 KiB
  records, the tool's defaults otherwise (acks=all, linger 5 ms, 16 KiB batches), as many records
  as `--seconds` of 1.1x the quota;
- `librdkafka-producer`: a librdkafka producer flat out for `--seconds` (1 KiB records, 128 KiB
  batches, linger 5 ms, acks=1, a 4 MiB queue: devkit.producing's);
- `java-consumer-small`, `java-consumer-large` (`consumer_byte_rate`): Kafka's
  `kafka-consumer-perf-test` (ConsumerPerformance) reading a partition of 1 KiB records filled
  beforehand, as many records as `--seconds` of 1.1x the quota, with `fetch.max.bytes` and
  `max.partition.fetch.bytes` of 64 KiB (small) or 50 MiB (large: each fetch is then capped by
  the quota's window, KAFKA-9677, and runs twice `--seconds`, as Kafka's broker then delivers
  ten seconds of quota at a time);
- `librdkafka-consumer-small`, `librdkafka-consumer-large`: a librdkafka consumer
  (bench.many_connections.read) reading the same for `--seconds`, with the same fetch sizes;
- `scram-precedence` (`producer_byte_rate`, KIP-55): three librdkafka producers flat out together
  over SCRAM-SHA-512, each to its own topic: alice with client-id `bulk`, alice with `other` and
  bob with `bulk`, under quotas on /users/alice/clients/bulk (half the quota), /users/alice (the
  quota), /users/<default> (three quarters) and /clients/bulk (a quarter, which the precedence
  never picks here). Each is judged against its own quota (cases `scram-user-client`,
  `scram-user`, `scram-default-user`). Kafka's path is its SASL listener, with the quotas set at
  its PLAINTEXT one; the proxy's a second proxy in SASL passthrough, the quotas set at it over
  SCRAM by `admin`;
- `java-create-topics` (`controller_mutation_rate`, KIP-599, 10 partitions/s): Kafka's own Admin
  client creating topics of two partitions one CreateTopics at a time, its retry on
  THROTTLING_QUOTA_EXCEEDED off so that each refusal (error 89) and its throttle time is seen
  (bench/java/CreateTopicsLoop.java, run as a source file on Kafka's jars). The rate is the
  partitions created; the topics are deleted after each run;
- `three-brokers` (`producer_byte_rate`): three Kafka brokers and a KRaft controller
  (devkit.kafka.KafkaCluster), the librdkafka producer flat out to a topic with one partition led
  by each broker. Each of Kafka's brokers enforces the quota on its own, so the client may have
  three times the quota; so may it through a proxy with `quota.scope: broker` (path `proxy`),
  both judged against three times the quota. A third path, `proxy-cluster`, goes through a proxy
  with `quota.scope: cluster`, one budget across the brokers, judged against the quota itself;
- `java-share-consumer` (`consumer_byte_rate`, KIP-932): Kafka's own KafkaShareConsumer reading
  the filled partition in a share group of its own from its start, saying after each poll how many
  value bytes it has (bench/java/ShareConsumeLoop.java). Kafka's broker answers a ShareFetch over
  the quota empty, and the records it had acquired for the member stay locked until their lock
  (30 s) runs out; the proxy delivers them and mutes the connection (docs/quotas.md, "Share
  groups"). A third path, `proxy-empty`, goes through a proxy with
  `quota.share_fetch_throttle: empty`, which answers as Kafka's broker does;
- `librdkafka-small-requests` (`request_percentage` 5, KIP-124): the librdkafka producer flat out
  with one 1 KiB record a request and one request in flight (linger 0), its rate the requests the
  broker appended per second (printed against a quota of 1). Kafka charges its request handler
  and network threads' time; the proxy its own time plus the broker's service time as it sees it
  (docs/quotas.md, "Request time at a proxy"): not the same time, so this case measures how far
  apart the two are rather than expecting them to agree.

For each case and path:
- rate: for producers the record bytes the broker appended (its end offsets, read every 50 ms
  straight from the broker, times the record size); for consumers the records the consumer was
  given (the Java consumer's FETCH requests, which its NetworkClient logs at DEBUG, each from the
  offset after what it had; librdkafka's records read), since through the proxy the broker also
  sends the fetches the proxy then holds back. Over whole 11 s windows from `--warm-up` after the
  first byte (Kafka's first allowance paid back; for consumers, after the group's first records,
  wherever it joined) to the last whole one before the last byte;
- worst: the most in any sliding 11 s window over the same span; for producers the most the
  end offsets grew between two readings at most 11 s apart (a burst about a window after the
  last one is then not counted with it from a reading before the window), for consumers the
  window stepped every 0.25 s;
- throttled: the responses that told the client to wait and their mean throttle time, as the
  client saw them (the Java client's NetworkClient logs each at TRACE, "Connection to node N is
  throttled for T ms"; librdkafka calls `throttle_cb`), and for the Java tools their own
  `produce-throttle-time-avg`/`-max` or `fetch-throttle-time-avg`/`-max` (`--print-metrics`).

With the rounds, each path's medians and the proxy's gap from Kafka's broker, against the bounds:
rate within 3%, worst window within 0.05x of the quota's worth, the mean throttle within 15%.

    python -m bench.kafka_fidelity                      # every case, three rounds
    python -m bench.kafka_fidelity --cases java-producer-1k --runs 5
    python -m bench.kafka_fidelity --cases scram-precedence --timelines /tmp/timelines
    make bench BENCH=kafka_fidelity

Printed, never asserted: docs/differences-from-kafka.md holds the measured table. Kafka, the
proxy and the clients share this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from bench.end_offsets import EndOffsets
from bench.many_connections import (
    CLIENT_ID,
    QUOTA,
    RATE_BOUND,
    WINDOW_BOUND,
    client_quota,
    create_topic,
    entity_quota,
    fill,
    read,
    throttle_cb,
)
from bench.shared_accuracy import SLIDING_S, fullest, fullest_between_readings
from devkit.kafka import (
    QUIET_LOG4J2,
    KafkaBroker,
    KafkaCluster,
    free_port,
    java_command,
    lib_dir,
    scram_client_properties,
    share_from_earliest,
)
from devkit.processes import ProxyProcess
from devkit.producing import RECORD, Timeline, produce

PATHS = ("kafka", "proxy")
# The three-broker case's third path: a proxy with quota.scope cluster, one budget for all three
# brokers, which Kafka has no counterpart for; judged against the quota alone.
ONE_BUDGET = "proxy-cluster"
# The share consumer case's third path: a proxy with quota.share_fetch_throttle empty, which
# answers a throttled ShareFetch empty as Kafka's broker does, where by default it delivers.
SHARE_EMPTY = "proxy-empty"
THROTTLE_BOUND = 0.15  # the proxy's median mean throttle within 15% of Kafka's
OVERRUN = 1.1  # a Java producer is given records for `seconds` at this many times the quota

# The tools' quiet config, and the one NetworkClient line a throttled response writes.
TRACE_NETWORK_LOG4J2 = QUIET_LOG4J2 + (
    "logger.network.name = org.apache.kafka.clients.NetworkClient\n"
    "logger.network.level = TRACE\n")
THROTTLED = re.compile(r"Connection to node -?\d+ is throttled for (\d+) ms")
SENT_FETCH = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] .*Sending FETCH request")
FETCH_OFFSET = re.compile(r"fetchOffset=(\d+)")
SMALL_FETCH, LARGE_FETCH = 64 * 1024, 50 * 1024 * 1024
METRIC = re.compile(r"^([\w-]+):([\w.-]+):\{([^}]*)\}\s*:\s*(\S+)\s*$")


@dataclass(frozen=True)
class Case:
    client: str  # "java" (Kafka's perf tools) or "librdkafka"
    record: int  # bytes of each record's value
    fetch: int | None = None  # a consumer's fetch.max.bytes and max.partition.fetch.bytes
    # runs this many times `--seconds`: a consumer of large fetches on Kafka's broker takes its
    # quota in bursts of ten seconds' worth (KAFKA-9677's cap), a few a minute
    longer: float = 1.0
    scram: bool = False  # the SCRAM users' precedence case: three producers, SCRAM_TENANTS
    mutations: bool = False  # topics created in a loop under controller_mutation_rate
    brokers: int = 1  # more: a KafkaCluster, a producer to partitions led by each of its brokers
    share: bool = False  # a KIP-932 share consumer (bench/java/ShareConsumeLoop.java)
    requests: bool = False  # one record a Produce, under request_percentage (KIP-124)

    @property
    def consumer(self) -> bool:
        return self.fetch is not None or self.share

    @property
    def key(self) -> str:
        if self.mutations:
            return "controller_mutation_rate"
        if self.requests:
            return "request_percentage"
        return "consumer_byte_rate" if self.consumer else "producer_byte_rate"


CASES = {
    "java-producer-1k": Case("java", 1024),
    "java-producer-16k": Case("java", 16 * 1024),
    "librdkafka-producer": Case("librdkafka", RECORD),
    "java-consumer-small": Case("java", RECORD, SMALL_FETCH),
    "java-consumer-large": Case("java", RECORD, LARGE_FETCH, 2.0),
    "librdkafka-consumer-small": Case("librdkafka", RECORD, SMALL_FETCH),
    "librdkafka-consumer-large": Case("librdkafka", RECORD, LARGE_FETCH, 2.0),
    "scram-precedence": Case("librdkafka", RECORD, scram=True),
    "java-create-topics": Case("java", 0, mutations=True),
    "three-brokers": Case("librdkafka", RECORD, brokers=3),
    "java-share-consumer": Case("java", RECORD, share=True),
    "librdkafka-small-requests": Case("librdkafka", RECORD, requests=True),
}

# The small-requests case's request_percentage: 5% of a thread's time in each window. Its rate
# is Produce requests per second (one record each), judged against a quota of 1 so as to print
# them as they are; Kafka's and the proxy's request times are not the same time (docs/quotas.md,
# "Request time at a proxy"), so this case shows how far apart they are.
REQUEST_PERCENTAGE = 5
ONE_RECORD_EACH = {"linger.ms": 0, "batch.num.messages": 1, "max.in.flight.requests.per.connection": 1}

# The mutations case: partitions/s, and the partitions of each topic it creates. Each accepted
# CreateTopics takes the bucket PARTITIONS below what it had, a throttle of PARTITIONS / MUTATIONS s
# (200 ms), so the topics come at five a second and a window holds 55 of them.
MUTATIONS, PARTITIONS = 10, 2
CREATE_TOPICS = Path(__file__).with_name("java") / "CreateTopicsLoop.java"
SHARE_CONSUME = Path(__file__).with_name("java") / "ShareConsumeLoop.java"
GIVEN = re.compile(r"^(\d+) (\d+)$", re.M)
CREATED = re.compile(r"^(\d+) created \S+$", re.M)
REFUSED = re.compile(r"^(\d+) refused (\d+)$", re.M)
FAILED = re.compile(r"^\d+ error (.*)$", re.M)

# The SCRAM case's users, created on Kafka's SASL listener; `admin` manages quotas at the proxy and
# `service` is the proxy's own login for its metadata.
SCRAM_USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret",
               "service": "service-secret"}
SCRAM_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class Tenant:
    """One producer of the SCRAM case: logged in as `user`, with `client_id`; the quota entity
    KIP-55's precedence picks for it gives it `share` of QUOTA."""

    case: str
    user: str
    client_id: str
    share: float


SCRAM_TENANTS = (
    Tenant("scram-user-client", "alice", CLIENT_ID, 0.5),  # /users/alice/clients/bulk
    Tenant("scram-user", "alice", "other", 1.0),  # /users/alice
    Tenant("scram-default-user", "bob", CLIENT_ID, 0.75),  # /users/<default>
)
# kafka-configs' entity arguments and each one's share of QUOTA. /clients/bulk ranks below
# /users/<default>: were the precedence wrong, bob's producer would get a quarter.
SCRAM_QUOTAS = (
    (("--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
      "--entity-name", CLIENT_ID), 0.5),
    (("--entity-type", "users", "--entity-name", "alice"), 1.0),
    (("--entity-type", "users", "--entity-default"), 0.75),
    (("--entity-type", "clients", "--entity-name", CLIENT_ID), 0.25),
)


@dataclass
class Outcome:
    """One path's run of one case."""

    case: str
    path: str
    round: int = 0
    rate: float | None = None  # bytes/s over whole windows, measured at the broker
    worst: float | None = None  # bytes in the fullest sliding 11 s window of that span
    worst_at: float = 0.0  # where that window starts, seconds after the start
    span: tuple[float, float] | None = None  # seconds after the start
    throttles: list[int] = field(default_factory=list)  # ms, each response that throttled
    metrics: dict[str, float] = field(default_factory=dict)  # the Java tool's --print-metrics
    errors: list[str] = field(default_factory=list)
    quota: float = QUOTA  # bytes/s, the quota the rate is judged against
    timeline: Timeline | None = None  # what was judged, for --timelines
    # set where there is no quota to divide by: the rate and the fullest window's rate are
    # printed as they are, in this unit, and the proxy's window is compared relatively
    unit: str = ""

    @property
    def mean_throttle(self) -> float | None:
        return statistics.fmean(self.throttles) if self.throttles else None


# -- reading what the clients say ---------------------------------------------------------------------

def throttles(text: str) -> list[int]:
    """The throttle time (ms) of each response a Java client logged as throttling it (at TRACE,
    TRACE_NETWORK_LOG4J2)."""
    return [int(m.group(1)) for m in THROTTLED.finditer(text)]


def fetch_positions(text: str, origin: float, record: int, wall_offset: float) -> Timeline:
    """A Java consumer's position over time from the FETCH requests its NetworkClient logged (at
    DEBUG): each asks from the offset after what it has been given, so the furthest offset asked so
    far times `record` (a partition of records of one size) is what it was given, stamped a few ms
    after it came. The log's times are this machine's wall clock in its time zone; `wall_offset`
    is time.time() - time.monotonic(), `origin` the monotonic start. One partition: offsets of
    several are not added up. (Its `--show-detailed-stats` are no clock: a line is printed only
    when a record is consumed after the interval, so a burst shows up to a throttle late.)"""
    out = Timeline([(0.0, 0)])
    furthest = first = None
    for line in text.splitlines():
        m = SENT_FETCH.match(line)
        if m is None:
            continue
        offsets = [int(x) for x in FETCH_OFFSET.findall(line)]
        if not offsets:
            continue
        if first is None:
            first = min(offsets)  # where it started reading: nothing given yet
        if furthest is not None and max(offsets) <= furthest:
            continue
        furthest = max(offsets)
        wall = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.marks.append((wall - wall_offset - origin, (furthest - first) * record))
    return out


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

def judge(timeline: Timeline, out: Outcome, warm_up: float, between_readings: bool = False) -> Outcome:
    """The rate over whole SLIDING_S windows from `warm_up` after the first byte to the last whole
    one before the last byte, and the fullest sliding window of that span: `fullest`'s, stepped
    every 0.25 s, or with `between_readings` (the broker's end offsets, read every READ_EVERY_S)
    the most counted between two readings a window apart (`fullest_between_readings`)."""
    out.timeline = timeline
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
    out.worst, out.worst_at = (fullest_between_readings(marks, start, end) if between_readings
                               else fullest(timeline.at, start, end))
    return out


# -- the workloads ------------------------------------------------------------------------------------

def java_tool(tool: str, args: Sequence[str], timeout: float, out: Outcome,
              print_metrics: bool = True) -> str:
    """One of Kafka's perf tools (`tool`: its class in org.apache.kafka.tools, or a Java source
    file on Kafka's jars) with `args`, its NetworkClient logging to standard error at TRACE: its
    throttled responses and (`print_metrics`, a perf tool's) its throttle metrics into `out`;
    returns its standard output, then that log."""
    main = tool if tool.endswith(".java") else f"org.apache.kafka.tools.{tool}"
    name = Path(tool).stem
    with tempfile.TemporaryDirectory(prefix="kafka-fidelity-") as scratch:
        log4j = Path(scratch, "log4j2.properties")
        log4j.write_text(TRACE_NETWORK_LOG4J2)
        cmd = java_command(main, *args, *(["--print-metrics"] if print_metrics else []),
                           lib=lib_dir(None), log4j=log4j)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            out.errors.append(f"{name} ran over {timeout:.0f} s")
            text = "".join(x.decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
            out.throttles = throttles(text)
            return text
    out.throttles = throttles(done.stderr)
    out.metrics = {k.split(":", 1)[1]: v for k, v in client_metrics(done.stdout).items()
                   if k.split(":", 1)[1] in THROTTLE_METRICS}
    if done.returncode != 0:
        out.errors.append(f"{name} exited {done.returncode}: "
                          f"{done.stderr.strip().splitlines()[-1:] or done.stdout[-300:]}")
    return done.stdout + done.stderr


THROTTLE_METRICS = ("produce-throttle-time-avg", "produce-throttle-time-max",
                    "fetch-throttle-time-avg", "fetch-throttle-time-max")


def rdkafka_produce(bootstrap: str, topic: str, seconds: float, start: float, out: Outcome,
                    client_id: str = CLIENT_ID, config: Mapping[str, object] | None = None,
                    per_broker: bool = False) -> None:
    """devkit.producing's librdkafka producer flat out for `seconds` from `start`, with `config`
    added to its settings, each throttle it was told into `out`, and from its last statistics the
    Produce requests it sent and their mean batch size: more requests, each smaller, are told more
    throttles, each shorter, for the same bytes. `per_broker`: also each broker's throttles (count
    and mean) and Produce requests."""
    told: list[int] = []
    by_broker: dict[int, list[int]] | None = {} if per_broker else None
    timeline = Timeline()
    stats: list[str] = []
    produce(bootstrap, topic, client_id, start, seconds, timeline,
            config={**(config or {}), "throttle_cb": throttle_cb(told, by_broker),
                    "statistics.interval.ms": 1000, "stats_cb": stats.append})
    out.throttles = told
    out.metrics.update(produce_statistics(stats, per_broker))
    for broker, ms in sorted((by_broker or {}).items()):
        out.metrics[f"throttled-{broker}"] = len(ms)
        out.metrics[f"throttle-mean-ms-{broker}"] = statistics.fmean(ms)
    if timeline.errors:
        out.errors.append(f"{timeline.errors} records not delivered")


def produce_statistics(texts: Sequence[str], per_broker: bool = False) -> dict[str, float]:
    """From librdkafka's statistics (JSON, one each interval): the Produce requests sent to all
    brokers (a counter: the last one's), and the mean size of the batches in them (bytes; each
    interval's `batchsize` window covers that interval only, so summed over all of them).
    `per_broker`: also each broker's Produce requests, by node id."""
    if not texts:
        return {}
    sent = [(b.get("nodeid", -1), b.get("req", {}).get("Produce", 0))
            for b in json.loads(texts[-1]).get("brokers", {}).values()]
    found: dict[str, float] = {"produce-requests": sum(n for _, n in sent)}
    if per_broker:  # not the bootstrap entries, whose node id is -1
        found.update((f"produce-requests-{node}", n) for node, n in sent if node >= 0)
    total = count = 0
    for text in texts:
        for topic in json.loads(text).get("topics", {}).values():
            total += topic.get("batchsize", {}).get("sum", 0)
            count += topic.get("batchsize", {}).get("cnt", 0)
    if count:
        found["batch-avg-bytes"] = total / count
    return found


def rdkafka_read(bootstrap: str, topic: str, group: str, fetch: int, seconds: float, start: float,
                 out: Outcome) -> Timeline:
    """bench.many_connections' librdkafka consumer in `group` for `seconds` from `start`,
    fetching at most `fetch` bytes: the bytes of the records it read over time, and each throttle
    it was told into `out`."""
    told: list[int] = []
    timeline = Timeline()
    read(bootstrap, topic, group, start, seconds, timeline,
         config={"fetch.max.bytes": fetch, "max.partition.fetch.bytes": fetch,
                 # librdkafka wants fetch.max.bytes at least this (1,000,000 by default)
                 "message.max.bytes": min(fetch, 1_000_000), "throttle_cb": throttle_cb(told)})
    out.throttles = told
    return timeline


def measure(name: str, path: str, broker: KafkaBroker, bootstrap: str, topic: str,
            seconds: float, warm_up: float, group: str = "fidelity") -> Outcome:
    """One run of case `name` on `path` at `bootstrap`; a consumer reads `topic` from its start in
    `group`, a group of its own (one that had committed would carry on from there)."""
    case = CASES[name]
    out = Outcome(name, path)
    seconds *= case.longer
    start = time.monotonic() + 0.5
    records = int(seconds * QUOTA * OVERRUN / case.record)
    timeout = seconds * 3 + 60
    if case.share:
        share_from_earliest(broker.bootstrap, group)
        limit = int(seconds * 2)
        text = java_tool(str(SHARE_CONSUME), [bootstrap, CLIENT_ID, group, topic, str(records),
                                              str(limit)], timeout, out, print_metrics=False)
        # its exit 2: the time ran out first (on Kafka's broker, locked records come back late)
        late = f"not all {records} records within {limit} s"
        out.errors = [late if e.startswith("ShareConsumeLoop exited 2") else e for e in out.errors]
        return judge(share_progress(text), out, warm_up)
    if case.fetch is not None:
        if case.client == "java":
            wall_offset = time.time() - time.monotonic()
            fetch = str(case.fetch)
            log = java_tool("ConsumerPerformance", [
                "--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
                "--group", group, "--timeout", "60000", "--fetch-size", fetch,
                "--command-property", f"client.id={CLIENT_ID}", "--command-property",
                f"fetch.max.bytes={fetch}"], timeout, out)
            given = fetch_positions(log, start, case.record, wall_offset)
        else:
            given = rdkafka_read(bootstrap, topic, group, case.fetch, seconds, start, out)
        return judge(given, out, warm_up)
    if case.requests:  # counted in requests (records), not bytes
        out.quota, out.unit = 1, "requests/s"
    with EndOffsets(broker.bootstrap, topic, 1, 1 if case.requests else case.record, start) as meter:
        if case.client == "java":
            java_tool("ProducerPerformance", [
                "--topic", topic, "--num-records", str(records), "--record-size", str(case.record),
                "--throughput", "-1", "--producer-props", f"bootstrap.servers={bootstrap}",
                f"client.id={CLIENT_ID}"], timeout, out)
        else:
            rdkafka_produce(bootstrap, topic, seconds, start, out,
                            config=ONE_RECORD_EACH if case.requests else None)
        time.sleep(0.5)  # the last acknowledged bytes' offsets
    return judge_end_offsets(meter, out, warm_up)


def judge_end_offsets(meter: EndOffsets, out: Outcome, warm_up: float) -> Outcome:
    """`judge` on what `meter` read, saying so where its readings failed or stalled."""
    if meter.timeline.errors:
        out.errors.append(f"{meter.timeline.errors} end-offset readings failed")
    out = judge(meter.timeline, out, warm_up, between_readings=True)
    stall, at = longest_gap(meter.timeline)
    if stall > 1.0:  # read every READ_EVERY_S: a window near it may hold up to that much less
        out.errors.append(f"the end offsets went unread for {stall:.1f} s from {at:.1f} s")
    return out


def measure_scram(path: str, broker: KafkaBroker, quotas_at: str, login: str | None, clients_at: str,
                  topics: Sequence[str], seconds: float, warm_up: float) -> list[Outcome]:
    """The SCRAM case on `path`: SCRAM_QUOTAS set with kafka-configs at `quotas_at` (logged in with
    the properties file `login`, if any), then SCRAM_TENANTS' producers flat out together at
    `clients_at`, each to its own one-partition topic of `topics`, each judged against its own
    share of QUOTA from the broker's end offsets; the quotas deleted after."""
    outs = [Outcome(t.case, path, quota=QUOTA * t.share) for t in SCRAM_TENANTS]
    for entity, share in SCRAM_QUOTAS:
        entity_quota(quotas_at, entity, "producer_byte_rate", int(QUOTA * share), login, settle=0)
    time.sleep(2)  # a broker applies a quota from its metadata a moment later
    try:
        start = time.monotonic() + 0.5
        meters = [EndOffsets(broker.bootstrap, topic, 1, RECORD, start) for topic in topics]
        with ExitStack() as stack:
            for meter in meters:
                stack.enter_context(meter)
            producers = [threading.Thread(target=rdkafka_produce, args=(
                clients_at, topic, seconds, start, out, t.client_id,
                {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": SCRAM_MECHANISM,
                 "sasl.username": t.user, "sasl.password": SCRAM_USERS[t.user]}))
                for topic, t, out in zip(topics, SCRAM_TENANTS, outs, strict=True)]
            for thread in producers:
                thread.start()
            for thread in producers:
                thread.join(seconds + 60)
            time.sleep(0.5)  # the last acknowledged bytes' offsets
    finally:
        for entity, _ in SCRAM_QUOTAS:
            entity_quota(quotas_at, entity, "producer_byte_rate", None, login, settle=0)
    return [judge_end_offsets(meter, out, warm_up) for meter, out in zip(meters, outs, strict=True)]


def share_progress(text: str) -> Timeline:
    """The value bytes ShareConsumeLoop was given over time: (seconds since its start, so far)."""
    return Timeline([(0.0, 0), *((int(m.group(1)) / 1000, int(m.group(2))) for m in GIVEN.finditer(text))])


def creations(text: str, partitions: int) -> Timeline:
    """The partitions CreateTopicsLoop created over time: (seconds since its start, so far)."""
    timeline = Timeline([(0.0, 0)])
    for i, m in enumerate(CREATED.finditer(text), 1):
        timeline.marks.append((int(m.group(1)) / 1000, i * partitions))
    return timeline


def measure_mutations(path: str, broker: KafkaBroker, bootstrap: str, prefix: str, seconds: float,
                      warm_up: float) -> Outcome:
    """The mutations case on `path`: Kafka's Admin client creating topics of PARTITIONS
    partitions at `bootstrap` one request at a time for `seconds`, its retry on error 89 off
    (bench/java/CreateTopicsLoop.java), judged against MUTATIONS partitions/s; every throttle its
    NetworkClient was told, and the refusals (error 89) with theirs. The topics are deleted after,
    straight at the broker by a client-id without a quota."""
    out = Outcome("java-create-topics", path, quota=MUTATIONS)
    text = java_tool(str(CREATE_TOPICS), [bootstrap, CLIENT_ID, prefix, str(PARTITIONS), str(int(seconds))],
                     seconds * 2 + 60, out, print_metrics=False)
    refused = [int(m.group(2)) for m in REFUSED.finditer(text)]
    out.metrics = {"refused": len(refused)}
    if refused:
        out.metrics["refused-throttle-avg"] = statistics.fmean(refused)
    out.errors.extend(m.group(1) for m in FAILED.finditer(text))
    created = creations(text, PARTITIONS)
    judge(created, out, warm_up)
    topics = [f"{prefix}-{i}" for i in range(len(created.marks) - 1)]
    if topics:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "client.id": "fidelity-admin"})
        for future in admin.delete_topics(topics, operation_timeout=60).values():
            future.result(120)
    return out


def led_by_each(cluster: KafkaCluster, topic: str) -> None:
    """Create `topic` with one partition on each of the cluster's brokers, which leads it."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    replicas = [[n.node_id] for n in cluster.nodes]
    admin.create_topics([NewTopic(topic, len(replicas), replica_assignment=replicas)])[topic].result(60)


def measure_brokers(path: str, cluster: KafkaCluster, bootstrap: str, topic: str, seconds: float,
                    warm_up: float) -> Outcome:
    """The three-broker case on `path`: the librdkafka producer flat out at `bootstrap` for
    `seconds` to `topic`, a partition led by each broker, its rate from the end offsets summed over
    them. Kafka's brokers each enforce the quota for their own partition, as does the proxy with
    scope broker: three times the quota, the measure for those paths; with scope cluster, one."""
    brokers = len(cluster.nodes)
    out = Outcome("three-brokers", path, quota=QUOTA * (1 if path == ONE_BUDGET else brokers))
    start = time.monotonic() + 0.5
    with EndOffsets(cluster.bootstrap, topic, brokers, RECORD, start) as meter:
        rdkafka_produce(bootstrap, topic, seconds, start, out, per_broker=True)
        time.sleep(0.5)  # the last acknowledged bytes' offsets
    # Partition i is led by the i-th node (`led_by_each`): what each broker appended.
    for node, appended in zip(cluster.nodes, meter.last, strict=False):
        out.metrics[f"appended-mb-{node.node_id}"] = appended * RECORD / 1e6
    return judge_end_offsets(meter, out, warm_up)


def longest_gap(timeline: Timeline) -> tuple[float, float]:
    """The longest time between two readings of `timeline`, and when it began."""
    marks = timeline.marks
    return max(((b[0] - a[0], a[0]) for a, b in zip(marks, marks[1:], strict=False)), default=(0.0, 0.0))


# -- the table -----------------------------------------------------------------------------------------

def rows_of(r: Outcome) -> list[tuple[str, str]]:
    name = f"{r.case}, {r.path}, run {r.round + 1}"
    rows = []
    if r.rate is not None and r.worst is not None and r.span is not None:
        if r.unit:
            rows.append((f"{name}: {r.unit}, {r.span[0]:.1f}-{r.span[1]:.1f} s",
                         f"{r.rate:.1f}, fullest window {r.worst / SLIDING_S:.1f} from {r.worst_at:.2f} s"))
        else:
            rows.append((f"{name}: rate / quota, {r.span[0]:.1f}-{r.span[1]:.1f} s",
                         f"{r.rate / r.quota:.3f}, worst {r.worst / (r.quota * SLIDING_S):.3f}x "
                         f"from {r.worst_at:.2f} s"))
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
        unit = next(iter(by_path.values()))[0].unit  # every run of a case has the same
        for path in (*PATHS, ONE_BUDGET, SHARE_EMPTY):
            runs = by_path.get(path)
            if not runs:
                continue
            quota = runs[0].quota  # every run of a case has the same
            rate = statistics.median(r.rate for r in runs if r.rate is not None) / quota
            worst = statistics.median(r.worst for r in runs if r.worst is not None) / (quota * SLIDING_S)
            means = [m for r in runs if (m := r.mean_throttle) is not None]
            throttle = statistics.median(means) if means else None
            mid[path] = (rate, worst, throttle)
            figures = (f"{rate:.1f} {unit}, fullest window {worst:.1f}" if unit
                       else f"{rate:.3f}, worst {worst:.3f}x")
            rows.append((f"{case}, {path}: median of {len(runs)}",
                         f"{figures}, mean throttle "
                         f"{'-' if throttle is None else f'{throttle:.0f} ms'} (rates "
                         f"{', '.join(f'{r.rate / quota:.3f}' for r in runs if r.rate is not None)})"))
        if "kafka" in mid and "proxy" in mid:
            rows.append((f"{case}: proxy - Kafka", gap(mid["kafka"], mid["proxy"],
                                                       relative_window=bool(unit))))
    return rows


def gap(kafka: tuple[float, float, float | None], proxy: tuple[float, float, float | None],
        relative_window: bool = False) -> str:
    """The proxy's medians against Kafka's: rate (relative), worst window (in the quota's worth, or
    with `relative_window` relative, where there is no quota to measure it in), mean throttle
    (relative), and whether all three are within the bounds."""
    rate_gap = proxy[0] / kafka[0] - 1
    if relative_window:
        window_gap = proxy[1] / kafka[1] - 1
        within = abs(rate_gap) <= RATE_BOUND and abs(window_gap) <= RATE_BOUND
        text = f"rate {rate_gap:+.1%}, fullest window {window_gap:+.1%}"
    else:
        window_gap = proxy[1] - kafka[1]
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


def write_timeline(directory: Path, out: Outcome) -> None:
    """`out`'s timeline as CSV (seconds, bytes or partitions so far), one file per case, path and
    round: where an outlier's fullest window came from."""
    if out.timeline is not None:
        # to the microsecond: whether a fullest window holds a burst can turn on less than a ms
        lines = [f"{t:.6f},{n}" for t, n in out.timeline.marks]
        Path(directory, f"{out.case}-{out.path}-{out.round + 1}.csv").write_text(
            "seconds,so_far\n" + "\n".join(lines) + "\n")


def run(cases: Sequence[str] = tuple(CASES), runs: int = 3, paths: Sequence[str] = PATHS,
        seconds: float = 55.0, warm_up: float = SLIDING_S,
        timelines: Path | None = None) -> list[tuple[str, str]]:
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    results: list[Outcome] = []
    rows: list[tuple[str, str]] = []

    def done(outs: list[Outcome], round_: int) -> None:
        """Keep a round's outcomes, write their timelines if asked, and print them as it goes,
        on standard error: a round of every case takes minutes."""
        for out in outs:
            out.round = round_
            if timelines is not None:
                write_timeline(timelines, out)
            print(*(f"{k:60s} {v}" for k, v in rows_of(out)), sep="\n", file=sys.stderr, flush=True)
        results.extend(outs)
    scram = any(CASES[c].scram for c in cases)
    with ExitStack() as stack:
        broker = (KafkaBroker(sasl_port=free_port(), scram_users=SCRAM_USERS) if scram
                  else KafkaBroker()).start()
        stack.callback(broker.close)
        proxy = ProxyProcess(broker.address, broker.node_id).start()
        stack.callback(proxy.stop)
        empty_proxy = None
        if any(CASES[c].share for c in cases):
            empty_proxy = ProxyProcess(broker.address, broker.node_id,
                                       extra_config={"quota": {"share_fetch_throttle": "empty"}})
            stack.callback(empty_proxy.stop)
            empty_proxy.start()
        if scram:
            # SASL passthrough to Kafka's SCRAM listener, where `admin` may manage quotas
            sasl_proxy = ProxyProcess(broker.sasl_address, broker.node_id, extra_config={
                "sasl": {"mode": "passthrough"},
                "upstream_sasl": {"mechanism": SCRAM_MECHANISM, "username": "service",
                                  "password": SCRAM_USERS["service"]},
                "quota": {"alter_principals": ["admin"]}})
            stack.callback(sasl_proxy.stop)
            sasl_proxy.start()
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="kafka-fidelity-"))
            admin = Path(scratch, "admin.properties")
            admin.write_text(scram_client_properties(SCRAM_MECHANISM, "admin", SCRAM_USERS["admin"]))
        if any(CASES[c].brokers > 1 for c in cases):
            cluster = KafkaCluster(brokers=max(CASES[c].brokers for c in cases)).start()
            stack.callback(cluster.close)
            cluster_proxies = {}
            for path, scope in (("proxy", "broker"), (ONE_BUDGET, "cluster")):
                ports = {n.node_id: free_port() for n in cluster.nodes}
                cluster_proxies[path] = ProxyProcess(cluster.bootstrap, 1, node_port=ports[1], extra_config={
                    "node_ports": ports, "quota": {"scope": scope}})
                stack.callback(cluster_proxies[path].stop)
                cluster_proxies[path].start()
        stamp = int(time.time())
        filled = None  # one partition filled once, that every consumer case reads in its own group
        if any(CASES[c].consumer for c in cases):
            filled = f"fidelity-filled-{stamp}"
            create_topic(broker.bootstrap, filled, 1)
            longest = max(CASES[c].longer for c in cases)
            fill(broker.bootstrap, filled, 1,
                 int((seconds * longest + 2 * SLIDING_S) * QUOTA * OVERRUN / 2**20) + 8)
        for round_ in range(runs):
            for name in cases:
                key = CASES[name].key
                if CASES[name].brokers > 1:
                    for path in [*paths, *([ONE_BUDGET] if "proxy" in paths else [])]:
                        topic = f"fidelity-{name}-{path}-{stamp}-{round_}"
                        led_by_each(cluster, topic)
                        bootstrap = cluster.bootstrap if path == "kafka" else cluster_proxies[path].bootstrap
                        client_quota(bootstrap, key, QUOTA)
                        try:
                            done([measure_brokers(path, cluster, bootstrap, topic, seconds, warm_up)],
                                 round_)
                        finally:
                            client_quota(bootstrap, key, None)
                    continue
                for path in [*paths, *([SHARE_EMPTY] if CASES[name].share and "proxy" in paths else [])]:
                    if CASES[name].scram:
                        topics = [f"fidelity-{t.case}-{path}-{stamp}-{round_}" for t in SCRAM_TENANTS]
                        for topic in topics:
                            create_topic(broker.bootstrap, topic, 1)
                        if path == "kafka":  # quotas at PLAINTEXT (no authorizer), clients at SASL
                            quotas_at, login, clients_at = broker.bootstrap, None, broker.sasl_address
                        else:
                            quotas_at, login, clients_at = (sasl_proxy.bootstrap, str(admin),
                                                            sasl_proxy.bootstrap)
                        done(measure_scram(path, broker, quotas_at, login, clients_at, topics,
                                           seconds, warm_up), round_)
                        continue
                    bootstrap = {"kafka": broker.bootstrap, "proxy": proxy.bootstrap,
                                 SHARE_EMPTY: empty_proxy.bootstrap if empty_proxy else ""}[path]
                    topic = f"fidelity-{name}-{path}-{stamp}-{round_}"
                    if CASES[name].mutations:
                        client_quota(bootstrap, key, MUTATIONS)
                    else:
                        if filled is not None and CASES[name].consumer:
                            topic = filled
                        else:
                            create_topic(broker.bootstrap, topic, 1)
                        client_quota(bootstrap, key, REQUEST_PERCENTAGE if CASES[name].requests else QUOTA)
                    try:
                        if CASES[name].mutations:
                            out = measure_mutations(path, broker, bootstrap, topic, seconds, warm_up)
                        else:
                            out = measure(name, path, broker, bootstrap, topic, seconds, warm_up,
                                          f"fidelity-{name}-{path}-{stamp}-{round_}")
                    finally:
                        client_quota(bootstrap, key, None)
                    done([out], round_)
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
    ap.add_argument("--timelines", type=Path, metavar="DIR",
                    help="write each run's measured timeline there as CSV")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs takes a number of at least 1")
    if args.timelines is not None:
        args.timelines.mkdir(parents=True, exist_ok=True)
    for name, value in run(args.cases, args.runs, args.paths, args.seconds, args.warm_up,
                           args.timelines):
        print(f"{name:60s} {value}", flush=True)


if __name__ == "__main__":
    main()
