"""The soak's clients, each a thread: producers that record what the broker acknowledged, two
readers that check every acknowledged record comes back, and the churn (clients that connect,
work and close; connections cut abruptly; quota changes through the API and the config file).

Every record's key is 8 bytes: the producer's index (top byte) and its sequence number, so a
reader can tell every record apart and count duplicates."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

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
