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
import struct
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from kafka.record import MemoryRecords

from devkit.processes import LOOPBACK, free_port
from kafka_quota_proxy.protocol.api_keys import INIT_PRODUCER_ID, METADATA, PRODUCE
from kafka_quota_proxy.protocol.errors import UnknownApiKey, UnsupportedApiVersion
from kafka_quota_proxy.protocol.headers import (
    frame_request,
    frame_response,
    parse_request_header,
    response_body_offset,
    response_prefix,
)
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.produce import produce_acks, refusal
from kafka_quota_proxy.protocol.rewrite import carries_addresses, rewrite_addresses

CODES = {
    89: "THROTTLING_QUOTA_EXCEEDED",
    19: "NOT_ENOUGH_REPLICAS",
    7: "REQUEST_TIMED_OUT",
    6: "NOT_LEADER_OR_FOLLOWER",
    56: "KAFKA_STORAGE_ERROR",
}
CLIENTS = ("confluent", "kafka-python", "aiokafka")
PARTITIONS = 3
REFUSAL_MESSAGE = "bench: topic over quota"
INIT_PRODUCER_ID_UPSTREAM = 3  # the oldest InitProducerId version Tansu 0.6.0 answers


# --------------------------------------------------------------------------- the interposer


@dataclass
class InterposerStats:
    requests: Counter = field(default_factory=Counter)  # api key -> count
    produce_for_topic: int = 0
    forwarded_produce: int = 0
    refused_requests: int = 0
    refused_batches: int = 0
    first_refusal: float | None = None
    metadata_after_refusal: int = 0
    gaps: list[float] = field(default_factory=list)  # refusal -> next send of its records
    produce_versions: Counter = field(default_factory=Counter)
    broken: list[str] = field(default_factory=list)  # protocol surprises
    broker_errors: Counter = field(default_factory=Counter)  # error code -> partition answers
    init_pid_upgraded: int = 0  # InitProducerId v0-v2 sent on as v3 (Tansu workaround)


def _values(records: Any) -> list[bytes]:
    """The record values of one partition's record set (our sequence numbers)."""
    if not records:
        return []
    out: list[bytes] = []
    mem = MemoryRecords(bytes(records))
    while mem.has_next():
        batch = mem.next_batch()
        if batch is None:
            break
        out += [r.value for r in batch]
    return out


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    try:
        prefix = await reader.readexactly(4)
        (size,) = struct.unpack(">i", prefix)
        return prefix + await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class Interposer:
    """A Kafka-frame relay on its own event loop thread, in front of the broker at `upstream_port`:
    Produce requests naming `topic` are refused with `code` during refusal windows."""

    def __init__(self, upstream_port: int, topic: str, code: int | None, refuse_s: float, pass_s: float):
        self.upstream_port = upstream_port
        self.topic = topic
        self.code = code
        self.refuse_s = refuse_s
        self.pass_s = pass_s
        self.port = free_port()
        self.stats = InterposerStats()
        self._t0: float | None = None
        self._refused_at: dict[bytes, float] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> Interposer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, self.port)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _refusing(self, now: float) -> bool:
        if self.code is None or self._t0 is None:
            return False
        return (now - self._t0) % (self.refuse_s + self.pass_s) < self.refuse_s

    def _mapper(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        return LOOPBACK, self.port

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            ureader, uwriter = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except OSError:
            cwriter.close()
            return
        answers: asyncio.Queue[asyncio.Future[bytes]] = asyncio.Queue()
        waiting: deque[tuple[asyncio.Future[bytes], int, int, Any]] = deque()
        tasks = [asyncio.create_task(self._requests(creader, uwriter, answers, waiting)),
                 asyncio.create_task(self._responses(ureader, waiting)),
                 asyncio.create_task(self._answers(answers, cwriter))]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.exception() is not None:
                self.stats.broken.append(repr(task.exception()))
        for task in pending:
            task.cancel()
        for writer in (cwriter, uwriter):
            writer.close()

    async def _requests(self, creader: asyncio.StreamReader, uwriter: asyncio.StreamWriter,
                        answers: asyncio.Queue[asyncio.Future[bytes]],
                        waiting: deque[tuple[asyncio.Future[bytes], int, int, Any]]) -> None:
        loop = asyncio.get_running_loop()
        while (frame := await _read_frame(creader)) is not None:
            view = memoryview(frame)
            try:
                hdr = parse_request_header(view)
            except (UnknownApiKey, UnsupportedApiVersion):
                # e.g. librdkafka's GetTelemetrySubscriptions (71): forwarded as it is, its
                # answer too (only the header's fixed fields are needed for that)
                api_key, api_version = struct.unpack_from(">hh", view, 4)
                self.stats.requests[api_key] += 1
                fut = loop.create_future()
                waiting.append((fut, api_key, api_version, None))
                answers.put_nowait(fut)
                uwriter.write(frame)
                await uwriter.drain()
                continue
            now = time.monotonic()
            self.stats.requests[hdr.api_key] += 1
            if hdr.api_key == METADATA and self.stats.first_refusal is not None:
                self.stats.metadata_after_refusal += 1
            expects_answer = True
            if (hdr.api_key == INIT_PRODUCER_ID and hdr.api_version < INIT_PRODUCER_ID_UPSTREAM
                    and hdr.spec is not None):
                # Tansu 0.6.0 answers InitProducerId v0-v2 (no producer_id/epoch fields, what
                # aiokafka sends) with UNKNOWN_SERVER_ERROR: sent on as v3 with -1/-1, and the
                # answer turned back into the client's version.
                self.stats.init_pid_upgraded += 1
                request = hdr.spec.request.decode(view[hdr.body_offset:], version=hdr.api_version)
                upgraded = hdr.spec.request(transactional_id=request.transactional_id,
                                            transaction_timeout_ms=request.transaction_timeout_ms,
                                            producer_id=-1, producer_epoch=-1)
                fut = loop.create_future()
                waiting.append((fut, hdr.api_key, hdr.api_version, (hdr.spec, hdr.correlation_id)))
                answers.put_nowait(fut)
                uwriter.write(frame_request(upgraded, INIT_PRODUCER_ID_UPSTREAM, hdr.correlation_id,
                                            hdr.client_id))
                await uwriter.drain()
                continue
            if hdr.api_key == PRODUCE:
                expects_answer = produce_acks(view, hdr.body_offset, hdr.api_version) != 0
                answer = self._produce(view, hdr, now)
                if answer is not None:
                    fut = loop.create_future()
                    fut.set_result(answer)
                    answers.put_nowait(fut)  # in its place in request order
                    continue
            if expects_answer:
                fut = loop.create_future()
                waiting.append((fut, hdr.api_key, hdr.api_version, hdr.spec))
                answers.put_nowait(fut)
            uwriter.write(frame)
            await uwriter.drain()

    def _produce(self, view: memoryview, hdr: Any, now: float) -> bytes | None:
        """The refusal to answer a Produce with, or None to forward it."""
        version = hdr.api_version
        assert hdr.spec is not None
        request = hdr.spec.request.decode(view[hdr.body_offset:], version=version)
        mine = [t for t in request.topic_data if t.name == self.topic]
        if not mine:
            return None
        self.stats.produce_for_topic += 1
        self.stats.produce_versions[version] += 1
        if self._t0 is None:
            self._t0 = now
        batches = [_values(p.records) for t in mine for p in t.partition_data]
        for values in batches:
            refused = [self._refused_at.pop(v) for v in values if v in self._refused_at]
            if refused:
                self.stats.gaps.append(now - max(refused))
        if not self._refusing(now):
            self.stats.forwarded_produce += 1
            return None
        assert self.code is not None
        self.stats.refused_requests += 1
        self.stats.refused_batches += len(batches)
        if self.stats.first_refusal is None:
            self.stats.first_refusal = now
        for values in batches:
            for v in values:
                self._refused_at[v] = now
        body = refusal(request, version, self.code, REFUSAL_MESSAGE, 0)
        return frame_response(hdr.correlation_id, hdr.spec.response_header_version(version), body)

    async def _responses(self, ureader: asyncio.StreamReader,
                         waiting: deque[tuple[asyncio.Future[bytes], int, int, Any]]) -> None:
        while (frame := await _read_frame(ureader)) is not None:
            if not waiting:
                raise RuntimeError("a response for no request")
            fut, api_key, version, spec = waiting.popleft()
            if isinstance(spec, tuple):  # an InitProducerId sent on as v3: back to `version`
                spec, correlation_id = spec
                up = INIT_PRODUCER_ID_UPSTREAM
                body_at = response_body_offset(memoryview(frame), spec.response_header_version(up))
                answer = spec.response.decode(memoryview(frame)[body_at:], version=up)
                back = spec.response(throttle_time_ms=answer.throttle_time_ms, error_code=answer.error_code,
                                     producer_id=answer.producer_id, producer_epoch=answer.producer_epoch)
                body = bytes(back.encode(version=version))
                fut.set_result(frame_response(correlation_id, spec.response_header_version(version), body))
                continue
            if api_key == PRODUCE and spec is not None:
                self._broker_errors(memoryview(frame), version, spec)
            if spec is not None and carries_addresses(api_key, version):
                view = memoryview(frame)
                body_at = response_body_offset(view, spec.response_header_version(version))
                new = rewrite_addresses(api_key, version, view[body_at:], self._mapper)
                if new is not None:
                    body = new.join() if isinstance(new, Pieces) else new
                    frame = response_prefix(view, body_at, len(body)) + body
            fut.set_result(frame)

    def _broker_errors(self, view: memoryview, version: int, spec: Any) -> None:
        """Count the broker's own partition errors for the topic (after a client's answer to a
        refusal, the broker may refuse what it sends next)."""
        body_at = response_body_offset(view, spec.response_header_version(version))
        answer = spec.response.decode(view[body_at:], version=version)
        for topic in answer.responses:
            if topic.name == self.topic:
                for part in topic.partition_responses:
                    if part.error_code:
                        self.stats.broker_errors[part.error_code] += 1

    async def _answers(self, answers: asyncio.Queue[asyncio.Future[bytes]],
                       cwriter: asyncio.StreamWriter) -> None:
        while True:
            frame = await (await answers.get())
            cwriter.write(frame)
            await cwriter.drain()


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
