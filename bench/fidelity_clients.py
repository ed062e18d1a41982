"""bench.kafka_fidelity's clients: Kafka's Java tools run with their NetworkClient logging each
throttled response, and librdkafka producing and reading with each throttle it is told and its
statistics."""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.fidelity_reading import Outcome, client_metrics, responses, throttles
from bench.many_connections import CLIENT_ID, read, requests_sent, throttle_cb
from devkit.kafka_jvm import QUIET_LOG4J2, java_command, lib_dir
from devkit.producing import Timeline, produce

# The tools' quiet config, and the one NetworkClient line a throttled response writes.
TRACE_NETWORK_LOG4J2 = QUIET_LOG4J2 + (
    "logger.network.name = org.apache.kafka.clients.NetworkClient\n"
    "logger.network.level = TRACE\n")


def java_tool(tool: str, args: Sequence[str], timeout: float, out: Outcome, api: str,
              print_metrics: bool = True) -> str:
    """One of Kafka's perf tools (`tool`: its class in org.apache.kafka.tools, or a Java source
    file on Kafka's jars) with `args`, its NetworkClient logging to standard error at TRACE: its
    throttled responses, how many responses of `api` (the quota's: PRODUCE, FETCH, ...) it had,
    and (`print_metrics`, a perf tool's) its throttle metrics into `out`; returns its standard
    output, then that log."""
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
            out.responses = responses(text, api)
            return text
    out.throttles = throttles(done.stderr)
    out.responses = responses(done.stderr, api)
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
    if "produce-requests" in out.metrics:  # sent: each answered (acks=1) but any timed out
        out.responses = int(out.metrics["produce-requests"])
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
    it was told and (from its last statistics) the Fetch requests it sent into `out`."""
    told: list[int] = []
    stats: list[str] = []
    timeline = Timeline()
    read(bootstrap, topic, group, start, seconds, timeline,
         config={"fetch.max.bytes": fetch, "max.partition.fetch.bytes": fetch,
                 # librdkafka wants fetch.max.bytes at least this (1,000,000 by default)
                 "message.max.bytes": min(fetch, 1_000_000), "throttle_cb": throttle_cb(told),
                 "statistics.interval.ms": 1000, "stats_cb": stats.append})
    out.throttles = told
    if stats:
        out.responses = requests_sent(json.loads(stats[-1]).get("brokers", {}).values(), "Fetch")
    return timeline
