"""Which Produce partition error makes real clients retry a refused topic, losing nothing?

Design question for topic quotas: when a Produce request carries partitions of a topic over its
quota, the proxy would answer that topic's partitions itself with an error code, without
forwarding them, and let the client retry. This measures, for each client library and candidate
error code, whether every record still arrives exactly once and in order per partition with no
delivery error reported to the application, and how long the client waits before resending.

A Tansu broker (memory storage) runs on loopback. Each run creates a fresh 3-partition topic
`hot-<n>` directly on Tansu and starts a child process holding a small TCP interposer in front of
Tansu and one producer connected to it. The interposer forwards Kafka frames both ways (it
rewrites broker addresses in Metadata, FindCoordinator, DescribeCluster and Produce/Fetch
node_endpoints so the client keeps coming back through it). From the first Produce for the topic
on, it alternates refusal and pass windows (default 1.5 s each, refusal first): in a refusal
window a Produce request that names the topic is answered by the interposer itself, every
partition failed with the candidate error code (base_offset -1, message "bench: topic over
quota"), and is not forwarded; in a pass window, and for other requests, frames go through
unchanged. One workaround for Tansu 0.6.0, which answers InitProducerId v0-v2 (aiokafka's only
version) with UNKNOWN_SERVER_ERROR: the interposer sends those on as v3 (producer id and epoch
-1) and turns the answer back into the client's version, so aiokafka's idempotent producer can
start. The producer sends N numbered records (value = sequence number, key = the same, so
they spread over the partitions) as fast as it can, then waits for every delivery report up to
--flush-timeout. The parent then reads the whole topic directly from Tansu (manual assignment
from offset 0, until each partition reports its end: Tansu's ListOffsets(latest) falls short of
the log end, docs/reliability.md) and counts delivered, duplicate, missing and out-of-order
records per partition.

Reported per (client, idempotence, error code), plus a baseline with no refusals:
- delivered / dups / missing / reordered: read back from Tansu;
- app errors: delivery errors the client reported to the application, by error name, and
  records still undelivered when the flush timed out; then the error codes the broker itself
  answered for the topic's partitions in forwarded Produce requests, if any;
- refusals: Produce requests the interposer refused (and partition batches in them);
- metadata: Metadata requests through the interposer (all, and after the first refusal);
- backoff: seconds between a refusal and the next send of any of its records (min/median/max),
  i.e. the client's retry backoff plus its own scheduling;
- time: first produce() call to the last delivery report (or the flush timeout).

Clients: confluent-kafka (librdkafka) Producer, kafka-python KafkaProducer, aiokafka
AIOKafkaProducer, each with idempotence on and off, all other settings at their defaults (acks
at each client's default for the idempotence setting; acks=0 is not measured: nothing can be
refused usefully).

    PYTHONPATH=. .venv/bin/python -m bench.produce_refusal_clients
    PYTHONPATH=. .venv/bin/python -m bench.produce_refusal_clients --n 3000 --codes 89,6 \\
        --clients confluent,aiokafka --refuse 1.5 --pass 1.5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.produce_refusal_interposer import Interposer
from devkit.processes import LOOPBACK
from kafka_quota_proxy.protocol.api_keys import METADATA

CODES = {
    89: "THROTTLING_QUOTA_EXCEEDED",
    19: "NOT_ENOUGH_REPLICAS",
    7: "REQUEST_TIMED_OUT",
    6: "NOT_LEADER_OR_FOLLOWER",
    56: "KAFKA_STORAGE_ERROR",
}
CLIENTS = ("confluent", "kafka-python", "aiokafka")
PARTITIONS = 3


# --------------------------------------------------------------------------- producers (child)


@dataclass
class ProduceOutcome:
    acked: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # error name -> records
    unfinished: int = 0  # no delivery report by the flush timeout
    seconds: float = 0.0
    setup_error: str | None = None


def _produce_confluent(bootstrap: str, topic: str, n: int, idempotent: bool, flush_timeout: float,
                       rate: float) -> ProduceOutcome:
    from confluent_kafka import KafkaError, Producer

    out = ProduceOutcome()
    purged = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)

    def report(err: Any, msg: Any) -> None:
        if err is None:
            out.acked += 1
        elif err.code() in purged:
            out.unfinished += 1
        else:
            out.errors[err.name()] = out.errors.get(err.name(), 0) + 1

    p = Producer({"bootstrap.servers": bootstrap, "client.id": "refusal-confluent",
                  "enable.idempotence": idempotent})
    start = time.monotonic()
    for i in range(n):
        _pace(start, i, rate)
        while True:
            try:
                p.produce(topic, key=b"%d" % i, value=b"%d" % i, on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(flush_timeout)
    out.seconds = time.monotonic() - start
    if left:
        p.purge()
        p.flush(5)
    return out


def _produce_kafka_python(bootstrap: str, topic: str, n: int, idempotent: bool, flush_timeout: float,
                          rate: float) -> ProduceOutcome:
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    out = ProduceOutcome()
    p = KafkaProducer(bootstrap_servers=bootstrap, client_id="refusal-kafka-python",
                      enable_idempotence=idempotent)
    start = time.monotonic()
    futures = []
    for i in range(n):
        _pace(start, i, rate)
        futures.append(p.send(topic, key=b"%d" % i, value=b"%d" % i))
    with contextlib.suppress(KafkaTimeoutError):
        p.flush(timeout=flush_timeout)
    deadline = start + flush_timeout + 5
    while not all(f.is_done for f in futures) and time.monotonic() < deadline:
        time.sleep(0.05)
    out.seconds = time.monotonic() - start
    for f in futures:
        if not f.is_done:
            out.unfinished += 1
        elif f.failed():
            name = type(f.exception).__name__
            out.errors[name] = out.errors.get(name, 0) + 1
        else:
            out.acked += 1
    with contextlib.suppress(Exception):
        p.close(timeout=5)
    return out


def _produce_aiokafka(bootstrap: str, topic: str, n: int, idempotent: bool, flush_timeout: float,
                      rate: float) -> ProduceOutcome:
    from aiokafka import AIOKafkaProducer

    async def run() -> ProduceOutcome:
        out = ProduceOutcome()
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="refusal-aiokafka",
                             enable_idempotence=idempotent)
        await asyncio.wait_for(p.start(), 30)
        start = time.monotonic()
        futures = []
        try:
            for i in range(n):
                if rate > 0:
                    await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
                futures.append(await asyncio.wait_for(p.send(topic, key=b"%d" % i, value=b"%d" % i),
                                                      flush_timeout))
            await asyncio.wait(futures, timeout=max(0.1, start + flush_timeout - time.monotonic()))
        except TimeoutError:
            pass
        out.seconds = time.monotonic() - start
        out.unfinished = n - len(futures)
        for f in futures:
            if not f.done():
                out.unfinished += 1
            elif f.exception() is not None:
                name = type(f.exception()).__name__
                out.errors[name] = out.errors.get(name, 0) + 1
            else:
                out.acked += 1
        with contextlib.suppress(Exception):
            await asyncio.wait_for(p.stop(), 10)
        return out

    return asyncio.run(run())


PRODUCERS = {"confluent": _produce_confluent, "kafka-python": _produce_kafka_python,
             "aiokafka": _produce_aiokafka}


def _pace(start: float, i: int, rate: float) -> None:
    if rate > 0:
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def child(spec: dict[str, Any]) -> None:
    """One producer run behind its own interposer; prints one JSON line and exits at once (a
    client thread that does not stop must not hold the process)."""
    interposer = Interposer(spec["upstream_port"], spec["topic"], spec["code"], spec["refuse"],
                            spec["pass"]).start()
    try:
        outcome = PRODUCERS[spec["client"]](interposer.address, spec["topic"], spec["n"], spec["idempotent"],
                                            spec["flush_timeout"], spec["rate"])
    except Exception as exc:  # a client that cannot even start is a result, not a crash
        outcome = ProduceOutcome(setup_error=f"{type(exc).__name__}: {exc}")
    stats = interposer.stats
    result = {"outcome": asdict(outcome), "interposer": {
        "requests": {str(k): v for k, v in stats.requests.items()},
        "produce_for_topic": stats.produce_for_topic, "forwarded_produce": stats.forwarded_produce,
        "refused_requests": stats.refused_requests, "refused_batches": stats.refused_batches,
        "metadata_after_refusal": stats.metadata_after_refusal, "gaps": stats.gaps,
        "produce_versions": {str(k): v for k, v in stats.produce_versions.items()},
        "broker_errors": {str(k): v for k, v in stats.broker_errors.items()},
        "broken": stats.broken, "init_pid_upgraded": stats.init_pid_upgraded}}
    print(json.dumps(result), flush=True)
    os._exit(0)


# --------------------------------------------------------------------------- the parent


def wait_ready(bootstrap: str, timeout: float = 30.0) -> None:
    """Until the broker answers a Metadata request."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.list_topics(timeout=timeout)


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)


def read_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> tuple[dict[int, list[int]], bool]:
    """Every record value per partition in offset order, read directly from the broker until each
    partition reports its end; and whether every partition did within `timeout`."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}", "enable.auto.commit": False,
                  "enable.partition.eof": True, "client.id": "refusal-check"})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(at_end) < PARTITIONS and time.monotonic() < deadline:
        for msg in c.consume(1000, 0.2):
            err = msg.error()
            partition: int = msg.partition()  # type: ignore[assignment]
            if err is None:
                values[partition].append(int(msg.value() or b"-1"))
            elif err.code() == KafkaError._PARTITION_EOF:
                at_end.add(partition)
    c.close()
    return values, len(at_end) == PARTITIONS


def judge(values: dict[int, list[int]], n: int) -> dict[str, int]:
    """delivered (records read), dups, missing (of 0..n-1), reordered (first occurrences below an
    earlier value of the same partition)."""
    seen: Counter = Counter()
    reordered = 0
    for vals in values.values():
        high = -1
        first: set[int] = set()
        for v in vals:
            seen[v] += 1
            if v in first:
                continue
            first.add(v)
            if v < high:
                reordered += 1
            high = max(high, v)
    delivered = sum(seen.values())
    return {"delivered": delivered, "dups": delivered - len(seen),
            "missing": sum(1 for i in range(n) if i not in seen), "reordered": reordered}


@dataclass
class Row:
    client: str
    idempotent: bool
    code: int | None
    topic: str
    result: dict[str, Any]


def run_one(args: argparse.Namespace, broker_port: int, topic: str, client: str, idempotent: bool,
            code: int | None) -> dict[str, Any]:
    bootstrap = f"{LOOPBACK}:{broker_port}"
    create_topic(bootstrap, topic)
    spec = {"upstream_port": broker_port, "topic": topic, "code": code, "refuse": args.refuse,
            "pass": args.pass_s, "client": client, "idempotent": idempotent, "n": args.n,
            "flush_timeout": args.flush_timeout, "rate": args.rate}
    started = time.monotonic()
    result: dict[str, Any] = {}
    try:
        command = [sys.executable, "-m", "bench.produce_refusal_clients", "--child", json.dumps(spec)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=args.flush_timeout + 90)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if lines:
            result = json.loads(lines[-1])
        else:
            result = {"failed": f"child exited {proc.returncode}: {proc.stderr.strip()[-500:]}"}
    except subprocess.TimeoutExpired:
        result = {"failed": f"child hung: killed after {args.flush_timeout + 90:.0f} s"}
    result["wall"] = time.monotonic() - started
    values, complete = read_topic(bootstrap, topic)
    result["read"] = judge(values, args.n)
    result["read_complete"] = complete
    return result


def _gap_text(gaps: list[float]) -> str:
    if not gaps:
        return "-"
    return f"{min(gaps) * 1000:.0f}/{statistics.median(gaps) * 1000:.0f}/{max(gaps) * 1000:.0f}"


def row_text(row: Row) -> str:
    r = row.result
    read = r["read"]
    code = "baseline" if row.code is None else f"{row.code} {CODES[row.code]}"
    idem = "on" if row.idempotent else "off"
    counts = f"{read['delivered']} | {read['dups']} | {read['missing']} | {read['reordered']}"
    if "failed" in r:
        return (f"| {row.client} | {idem} | {code} | {counts} | FAILED: {r['failed']} | - | - | - | "
                f"{r['wall']:.1f} |")
    out = r["outcome"]
    ip = r["interposer"]
    errors = ", ".join(f"{k} x{v}" for k, v in sorted(out["errors"].items()))
    if out["unfinished"]:
        errors = (errors + ", " if errors else "") + f"unfinished x{out['unfinished']}"
    if out["setup_error"]:
        errors = (errors + ", " if errors else "") + f"setup: {out['setup_error']}"
    if ip["broker_errors"]:
        errors = (errors + "; " if errors else "") + "broker answered: " + ", ".join(
            f"{k} x{v}" for k, v in sorted(ip["broker_errors"].items()))
    if not r["read_complete"]:
        errors += " (read-back incomplete)"
    meta = f"{ip['requests'].get(str(METADATA), 0)} ({ip['metadata_after_refusal']})"
    refusals = f"{ip['refused_requests']} ({ip['refused_batches']})"
    broken = f" interposer: {ip['broken']}" if ip["broken"] else ""
    return (f"| {row.client} | {idem} | {code} | {counts} | {errors or '0'}{broken} | {refusals} | {meta} | "
            f"{_gap_text(ip['gaps'])} | {out['seconds']:.1f} |")


HEADER = ("| client | idempotence | error code | delivered | dups | missing | reordered | app errors | "
          "refusals (batches) | metadata (after 1st refusal) | backoff ms min/med/max | time s |\n"
          "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=3000, help="records per run (default 3000)")
    parser.add_argument("--codes", default=",".join(str(c) for c in CODES),
                        help="error codes to refuse with, comma-separated (default: %(default)s)")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="default: %(default)s")
    parser.add_argument("--idempotence", default="on,off", help="on, off or both (default: %(default)s)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the runs without refusals")
    parser.add_argument("--refuse", type=float, default=1.5, help="refusal window, s (default 1.5)")
    parser.add_argument("--pass", dest="pass_s", type=float, default=1.5, help="pass window, s (default 1.5)")
    parser.add_argument("--rate", type=float, default=0.0, help="records/s; 0: flat out (default)")
    parser.add_argument("--flush-timeout", type=float, default=60.0, help="s to wait for deliveries (60)")
    parser.add_argument("--json", help="also write every run's raw result to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return

    from devkit.tansu import Broker

    codes: list[int | None] = [] if args.no_baseline else [None]
    codes += [int(c) for c in args.codes.split(",") if c]
    unknown = [c for c in codes if c is not None and c not in CODES]
    if unknown:
        parser.error(f"unknown codes {unknown}; choose from {sorted(CODES)}")
    clients = [c for c in args.clients.split(",") if c]
    if set(clients) - set(CLIENTS):
        parser.error(f"clients are {', '.join(CLIENTS)}")
    idem = [{"on": True, "off": False}[x] for x in args.idempotence.split(",")]

    began = time.monotonic()
    broker = Broker().start()
    rows: list[Row] = []
    try:
        wait_ready(broker.address)
        print(HEADER, flush=True)
        n = 0
        for client in clients:
            for idempotent in idem:
                for code in codes:
                    n += 1
                    topic = f"hot-{n}"
                    result = run_one(args, broker.port, topic, client, idempotent, code)
                    rows.append(Row(client, idempotent, code, topic, result))
                    print(row_text(rows[-1]), flush=True)
    finally:
        broker.stop()
        if args.json:
            with open(args.json, "w") as f:
                json.dump([asdict(r) for r in rows], f, indent=1)
    rate = "flat out" if not args.rate else f"{args.rate:g}/s"
    print(f"\n{len(rows)} runs, N={args.n}, refuse {args.refuse} s / pass {args.pass_s} s, rate {rate}; "
          f"wall clock {time.monotonic() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
