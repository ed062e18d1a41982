"""The soak's clients, each a thread: producers that record what the broker acknowledged, two
readers that check every acknowledged record comes back, and the churn (clients that connect,
work and close; connections cut abruptly; quota changes through the API and the config file).

Every record's key is 8 bytes: the producer's index (top byte) and its sequence number, so a
reader can tell every record apart and count duplicates."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devkit.soak.quota_admin import QuotaAdmin
from devkit.soak.verdict import Jump
from devkit.tansu import FIRST_OFFSET

SIZE = 512  # bytes a record's value
FLUSH_SECONDS = 60.0  # how long a producer may take to finish what it has in flight at the end


def record_key(producer: int, seq: int) -> bytes:
    return ((producer << 56) | seq).to_bytes(8, "big")


def key_producer(key: int) -> int:
    return key >> 56


@dataclass(slots=True)
class Failure:
    """A delivery error: when it first came (seconds into the run), what it said, and how many
    records it failed. kafka-python fails every record of an expired batch with one exception
    object, so a batch is one Failure, not one line per record."""

    at: float
    what: str
    records: int = 1

    def __str__(self) -> str:
        return f"{self.at:.0f} s: {self.what}" + (f" ({self.records} records)" if self.records > 1 else "")


class Ledger:
    """Every record a broker acknowledged, by key, which producers were idempotent (their
    records must be in the log exactly once; the others' at least once), and the delivery errors."""

    MAX_ERRORS = 100

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.start = time.monotonic()
        self.acked: set[int] = set()
        self.idempotent: set[int] = set()
        self.errors: list[Failure] = []
        self._by_cause: dict[int, tuple[object, Failure]] = {}  # the cause kept, so its id stays its own

    def ack(self, producer: int, seq: int) -> None:
        with self.lock:
            self.acked.add((producer << 56) | seq)

    def error(self, what: str, cause: object | None = None) -> None:
        """One record's delivery error; records failed by the same `cause` object count as one."""
        with self.lock:
            known = self._by_cause.get(id(cause)) if cause is not None else None
            if known is not None and known[0] is cause:
                known[1].records += 1
            elif len(self.errors) < self.MAX_ERRORS:
                failure = Failure(time.monotonic() - self.start, what)
                self.errors.append(failure)
                if cause is not None:
                    self._by_cause[id(cause)] = (cause, failure)

    def count(self) -> int:
        return len(self.acked)


class Worker(threading.Thread):
    """A thread that runs until `halt`; `quiet` asks the churn to stop between rounds (for a
    reading with only the long-lived clients connected), `idle` says it has."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.halt = threading.Event()
        self.quiet = threading.Event()
        self.idle = threading.Event()
        self.rounds = 0
        self.failures: list[str] = []

    def nap(self, seconds: float) -> None:
        """Sleep, and while `quiet` is asked for, stay idle (not connected)."""
        self.halt.wait(seconds)
        while self.quiet.is_set() and not self.halt.is_set():
            self.idle.set()
            self.halt.wait(0.1)
        self.idle.clear()

    def fail(self, what: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(f"{time.strftime('%H:%M:%S')} {what}")


class ConfluentProducer(Worker):
    """librdkafka, idempotent, `rate` records a second (token bucket) or flat out (None)."""

    def __init__(self, bootstrap: str, topic: str, client_id: str, index: int, rate: float | None,
                 ledger: Ledger, **config: Any) -> None:
        from confluent_kafka import Producer

        super().__init__(f"producer-{client_id}")
        self.topic, self.index, self.rate, self.ledger = topic, index, rate, ledger
        ledger.idempotent.add(index)
        self.payload = os.urandom(SIZE)
        self.producer: Any = Producer({
            "bootstrap.servers": bootstrap, "client.id": client_id, "enable.idempotence": True,
            "linger.ms": 5, "queue.buffering.max.kbytes": 512, **config})
        self.unflushed = 0

    def _delivered(self, err: Any, msg: Any) -> None:
        from confluent_kafka import KafkaError

        if err is None:
            self.ledger.ack(self.index, int.from_bytes(msg.key(), "big") & ((1 << 56) - 1))
        elif err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            self.ledger.error(f"{self.name}: {err}")

    def run(self) -> None:
        p, seq, tokens, last = self.producer, 0, 0.0, time.monotonic()
        while not self.halt.is_set():
            if self.rate is None:
                budget = 100
            else:
                now = time.monotonic()
                tokens = min(tokens + (now - last) * self.rate, self.rate / 10)
                last = now
                budget = int(tokens)
            sent = 0
            while sent < budget:
                try:
                    p.produce(self.topic, key=record_key(self.index, seq), value=self.payload,
                              on_delivery=self._delivered)
                except BufferError:  # the client's queue is full (throttled): let it drain
                    p.poll(0.05)
                    break
                seq += 1
                sent += 1
            tokens -= sent
            p.poll(0.01)
        p.purge(in_queue=True, in_flight=False, blocking=True)  # never sent: never acknowledged
        self.unflushed = p.flush(FLUSH_SECONDS)
        self.producer = p = None  # the last reference: the client is destroyed, its connections closed


class KafkaPythonProducer(Worker):
    """kafka-python, idempotent (acks=all), `rate` records a second."""

    def __init__(self, bootstrap: str, topic: str, client_id: str, index: int, rate: float,
                 ledger: Ledger) -> None:
        from kafka import KafkaProducer

        super().__init__(f"producer-{client_id}")
        self.topic, self.index, self.rate, self.ledger = topic, index, rate, ledger
        ledger.idempotent.add(index)
        self.payload = os.urandom(SIZE)
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id,
                                      enable_idempotence=True, acks="all", linger_ms=5)
        self.sent = 0
        self.longest_wait = 0.0  # seconds from send() to the acknowledgement, the longest seen

    def run(self) -> None:
        start = time.monotonic()
        while not self.halt.is_set():
            seq = self.sent
            if seq >= self.rate * (time.monotonic() - start):
                self.halt.wait(0.01)
                continue
            future = self.producer.send(self.topic, key=record_key(self.index, seq), value=self.payload)
            future.add_callback(self._acked, seq, time.monotonic())
            future.add_errback(lambda exc: self.ledger.error(f"{self.name}: {exc!r}", cause=exc))
            self.sent = seq + 1
        try:
            self.producer.flush(timeout=FLUSH_SECONDS)
        except Exception as exc:  # kafka-python's KafkaTimeoutError: reported, not raised
            self.fail(f"flush: {exc!r}")
        self.producer.close(timeout=10)

    def _acked(self, seq: int, sent: float, metadata: Any) -> None:
        self.ledger.ack(self.index, seq)
        self.longest_wait = max(self.longest_wait, time.monotonic() - sent)


class Reader(Worker):
    """librdkafka consumer: in `group` (subscribed, offsets committed) or, with group None, by
    plain fetches of every partition from offset 0. Counts each key seen and the repeats,
    and notes every jump forward in the offsets it returns (a record passed over)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, client_id: str,
                 group: str | None) -> None:
        from confluent_kafka import Consumer

        super().__init__(f"reader-{client_id}")
        self.topic, self.partitions, self.group = topic, partitions, group
        self.consumer: Any = Consumer({
            "bootstrap.servers": bootstrap, "client.id": client_id,
            "group.id": group or f"{client_id}-unused", "enable.auto.commit": group is not None,
            "auto.offset.reset": "earliest"})
        self.seen: set[int] = set()
        self.repeats: list[int] = []
        self.errors: list[str] = []
        self.positions: list[int] = []  # at the end, each partition's position
        self.next_offsets: dict[int, int] = {}  # by partition, the offset after the last returned
        self.jumps: list[Jump] = []
        self.assignments = 0  # the group's: partitions assigned, the first time and after each rebalance

    def run(self) -> None:
        from confluent_kafka import TopicPartition

        c = self.consumer
        if self.group is None:
            c.assign([TopicPartition(self.topic, p, FIRST_OFFSET) for p in range(self.partitions)])
        else:
            c.subscribe([self.topic], on_assign=self._assigned)
        while not self.halt.is_set():
            for msg in c.consume(num_messages=1000, timeout=0.2):
                if msg.error() is not None:
                    if len(self.errors) < 50:
                        self.errors.append(str(msg.error()))
                    continue
                partition, offset = msg.partition(), msg.offset()
                expected = self.next_offsets.get(partition, 0)  # both start at the beginning
                if offset > expected and len(self.jumps) < 1000:
                    self.jumps.append(Jump(partition, expected, offset))
                self.next_offsets[partition] = offset + 1
                key = int.from_bytes(msg.key(), "big")
                if key in self.seen:
                    self.repeats.append(key)
                else:
                    self.seen.add(key)
        self.positions = [tp.offset for tp in sorted(c.position(c.assignment()), key=lambda tp: tp.partition)]
        c.close()

    def _assigned(self, consumer: Any, partitions: Any) -> None:
        self.assignments += 1


@dataclass
class ReadBack:
    """The whole log as a fresh consumer read it after the workload stopped."""

    seen: set[int]
    repeats: list[int]
    positions: list[int]
    errors: list[str]
    where: dict[int, tuple[int, int]]  # the watched keys' partition and offset


def read_back(bootstrap: str, topic: str, partitions: int, watch: set[int] | None = None,
              idle_seconds: float = 3.0) -> ReadBack:
    """Read every partition from offset 0 (devkit.tansu.FIRST_OFFSET) by plain fetches until
    nothing more has come for `idle_seconds`; note where each key in `watch` is."""
    from confluent_kafka import Consumer, TopicPartition

    c: Any = Consumer({"bootstrap.servers": bootstrap, "client.id": "soak-read-back",
                       "group.id": "soak-read-back-unused", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, FIRST_OFFSET) for p in range(partitions)])
    out = ReadBack(set(), [], [], [], {})
    watch = watch or set()
    last = time.monotonic()
    while time.monotonic() - last < idle_seconds:
        batch = c.consume(num_messages=1000, timeout=0.5)
        if batch:
            last = time.monotonic()
        for msg in batch:
            if msg.error() is not None:
                out.errors.append(str(msg.error()))
                continue
            key = int.from_bytes(msg.key(), "big")
            if key in out.seen:
                out.repeats.append(key)
            else:
                out.seen.add(key)
                if key in watch:
                    out.where[key] = (msg.partition(), msg.offset())
    out.positions = [tp.offset for tp in sorted(c.position(c.assignment()), key=lambda tp: tp.partition)]
    c.close()
    return out


class Churn(Worker):
    """Clients that connect, do a little work and close, one after another, round and round:
    an idempotent librdkafka producer, an idempotent kafka-python producer, an aiokafka producer
    (not idempotent: Tansu refuses aiokafka's InitProducerId), and a kafka-python consumer that
    fetches under a consumer_byte_rate quota."""

    RECORDS = 50

    def __init__(self, bootstrap: str, topic: str, ledger: Ledger, first_index: int) -> None:
        super().__init__("churn")
        self.bootstrap, self.topic, self.ledger = bootstrap, topic, ledger
        self.indexes = {"confluent": first_index, "kafka-python": first_index + 1,
                        "aiokafka": first_index + 2}
        ledger.idempotent.update({first_index, first_index + 1})
        self.seqs = dict.fromkeys(self.indexes, 0)
        self.fetched = 0
        self.steps: list[Callable[[], None]] = [self._confluent, self._kafka_python, self._aiokafka,
                                                self._fetch]

    def run(self) -> None:
        while not self.halt.is_set():
            step = self.steps[self.rounds % len(self.steps)]
            try:
                step()
            except Exception as exc:  # a client library's failure: reported, the soak goes on
                self.fail(f"{step.__name__}: {exc!r}")
            self.rounds += 1
            self.nap(0.5)

    def _keys(self, kind: str) -> list[tuple[int, int]]:
        index, first = self.indexes[kind], self.seqs[kind]
        self.seqs[kind] += self.RECORDS
        return [(index, s) for s in range(first, first + self.RECORDS)]

    def _confluent(self) -> None:
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": self.bootstrap, "client.id": "soak-churn-confluent",
                      "enable.idempotence": True, "linger.ms": 5})

        def delivered(err: Any, msg: Any) -> None:
            index, seq = divmod(int.from_bytes(msg.key(), "big"), 1 << 56)
            if err is None:
                self.ledger.ack(index, seq)
            else:
                self.ledger.error(f"churn confluent: {err}")

        for index, seq in self._keys("confluent"):
            p.produce(self.topic, key=record_key(index, seq), value=b"c" * SIZE, on_delivery=delivered)
        if p.flush(FLUSH_SECONDS):
            self.fail("confluent: not flushed")
        del p  # the handle is destroyed and its connections closed here

    def _kafka_python(self) -> None:
        from kafka import KafkaProducer

        p = KafkaProducer(bootstrap_servers=self.bootstrap, client_id="soak-churn-kafka-python",
                          enable_idempotence=True, acks="all")
        futures = [(index, seq, p.send(self.topic, key=record_key(index, seq), value=b"k" * SIZE))
                   for index, seq in self._keys("kafka-python")]
        p.flush(timeout=FLUSH_SECONDS)
        for index, seq, f in futures:
            try:
                f.get(timeout=1)
            except Exception as exc:
                self.ledger.error(f"churn kafka-python: {exc!r}", cause=exc)
            else:
                self.ledger.ack(index, seq)
        p.close(timeout=10)

    def _aiokafka(self) -> None:
        from aiokafka import AIOKafkaProducer

        async def work() -> None:
            p = AIOKafkaProducer(bootstrap_servers=self.bootstrap, client_id="soak-churn-aiokafka",
                                 acks="all")
            await p.start()
            try:
                for index, seq in self._keys("aiokafka"):
                    await p.send_and_wait(self.topic, key=record_key(index, seq), value=b"a" * SIZE)
                    self.ledger.ack(index, seq)
            finally:
                await p.stop()

        asyncio.run(work())

    def _fetch(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        c = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="soak-churn-fetch",
                          enable_auto_commit=False, consumer_timeout_ms=3000)
        c.assign([TopicPartition(self.topic, 0)])
        c.seek_to_beginning()
        for n, _ in enumerate(c, 1):
            self.fetched += 1
            if n >= 2000:
                break
        c.close()


class AbruptCloser(Worker):
    """Connections that end without a goodbye (a reset, SO_LINGER 0), round and round: right after
    connecting, in the middle of a request frame, and with a request in flight."""

    EVERY_SECONDS = 10.0

    def __init__(self, host: str, port: int) -> None:
        super().__init__("abrupt")
        self.address = (host, port)

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                with socket.create_connection(self.address, timeout=10) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    frame = _metadata_request(self.rounds)
                    if self.rounds % 3 == 1:
                        s.sendall(frame[: len(frame) // 2])
                    elif self.rounds % 3 == 2:
                        s.sendall(frame)
                    # leaving the block closes the socket: a reset, with SO_LINGER 0
            except OSError as exc:
                self.fail(f"abrupt: {exc!r}")
            self.rounds += 1
            self.nap(self.EVERY_SECONDS)


def _metadata_request(correlation_id: int) -> bytes:
    from kafka.protocol.metadata import MetadataRequest

    req: Any = MetadataRequest[1](topics=None)
    req.with_header(correlation_id=correlation_id, client_id="soak-abrupt")
    return bytes(req.encode(version=1, header=True, framed=True))


class QuotaChanger(Worker):
    """AlterClientQuotas every `every` seconds: the throttled producer's producer_byte_rate goes
    round `values`; every fifth change is read back with DescribeClientQuotas."""

    def __init__(self, host: str, port: int, client_id: str, values: list[int], every: float) -> None:
        super().__init__("quota-changer")
        self.admin = QuotaAdmin(host, port)
        self.client_id, self.values, self.every = client_id, values, every
        self.changes = 0

    def run(self) -> None:
        while not self.halt.is_set():
            value = self.values[self.rounds % len(self.values)]
            try:
                code = self.admin.alter([("client-id", self.client_id)], "producer_byte_rate", value)
                if code != 0:
                    self.fail(f"AlterClientQuotas: error code {code}")
                else:
                    self.changes += 1
                if self.rounds % 5 == 0:
                    described = self.admin.describe(self.client_id)
                    if described != {"producer_byte_rate": float(value)}:
                        self.fail(f"DescribeClientQuotas: {described}, expected {value}")
            except OSError as exc:
                self.fail(f"quota admin: {exc!r}")
            self.rounds += 1
            self.halt.wait(self.every)
        self.admin.close()


class ConfigRewriter(Worker):
    """Rewrites the proxy's YAML every `every` seconds, its `quotas:` list going round `variants`.
    The file is replaced (a temporary file renamed over it), as an editor or a config manager does."""

    def __init__(self, path: Path, variants: list[list[dict[str, Any]]], every: float) -> None:
        super().__init__("config-rewriter")
        self.path, self.variants, self.every = path, variants, every
        self.rewrites = 0

    def write(self, quotas: list[dict[str, Any]]) -> None:
        config = yaml.safe_load(self.path.read_text())
        config["quotas"] = quotas
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config))
        os.replace(tmp, self.path)

    def run(self) -> None:
        while not self.halt.wait(self.every):
            self.rounds += 1
            try:
                self.write(self.variants[self.rounds % len(self.variants)])
                self.rewrites += 1
            except OSError as exc:
                self.fail(f"config rewrite: {exc!r}")


def stop_all(workers: list[Worker], timeout: float) -> list[str]:
    """Halt the workers and wait for them; the names of those still running after `timeout`."""
    for w in workers:
        w.halt.set()
    deadline = time.monotonic() + timeout
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    return [w.name for w in workers if w.is_alive()]


def pause(workers: list[Worker], timeout: float) -> bool:
    """Ask the churn to stop between rounds; True once every one of them is idle."""
    for w in workers:
        w.quiet.set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(w.idle.is_set() or not w.is_alive() for w in workers):
            return True
        time.sleep(0.1)
    return False


def resume(workers: list[Worker]) -> None:
    for w in workers:
        w.quiet.clear()
