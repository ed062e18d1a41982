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
  (devkit.kafka_cluster.KafkaCluster), the librdkafka producer flat out to a topic with one partition led
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
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench.end_offsets import EndOffsets
from bench.fidelity_clients import java_tool, rdkafka_produce, rdkafka_read
from bench.fidelity_reading import (
    ONE_BUDGET,
    PATHS,
    SHARE_EMPTY,
    Outcome,
    fetch_positions,
    judge,
    judge_end_offsets,
    share_progress,
)
from bench.fidelity_table import medians, rows_of, write_timeline
from bench.fidelity_workloads import (
    MUTATIONS,
    SCRAM_MECHANISM,
    SCRAM_TENANTS,
    SCRAM_USERS,
    led_by_each,
    measure_brokers,
    measure_mutations,
    measure_scram,
)
from bench.many_connections import (
    CLIENT_ID,
    QUOTA,
    client_quota,
    create_topic,
    fill,
)
from bench.shared_accuracy import SLIDING_S
from devkit.kafka import KafkaBroker
from devkit.kafka_cluster import KafkaCluster
from devkit.kafka_jvm import free_port, scram_client_properties, share_from_earliest
from devkit.processes import ProxyProcess
from devkit.producing import RECORD

OVERRUN = 1.1  # a Java producer is given records for `seconds` at this many times the quota

SMALL_FETCH, LARGE_FETCH = 64 * 1024, 50 * 1024 * 1024


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

SHARE_CONSUME = Path(__file__).with_name("java") / "ShareConsumeLoop.java"


# -- one client of a case, and the rounds (the other workloads: fidelity_workloads.py) ---------------

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
                                              str(limit)], timeout, out, "SHARE_FETCH",
                         print_metrics=False)
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
                f"fetch.max.bytes={fetch}"], timeout, out, "FETCH")
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
                f"client.id={CLIENT_ID}"], timeout, out, "PRODUCE")
        else:
            rdkafka_produce(bootstrap, topic, seconds, start, out,
                            config=ONE_RECORD_EACH if case.requests else None)
        time.sleep(0.5)  # the last acknowledged bytes' offsets
    return judge_end_offsets(meter, out, warm_up)


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
