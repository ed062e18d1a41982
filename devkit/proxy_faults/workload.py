"""The load a proxy fault is injected under, and the check of what reached the broker.

An idempotent librdkafka producer (acks=all) sends numbered records through the proxy, round
robin over the partitions, and records every acknowledgement with its partition and offset; a
consumer reads them back through the proxy. Afterwards the topic is read directly from the
broker: every acknowledged record must be there, once, in the partition it was sent to, and
each partition's numbers must rise (the order they were sent in).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


@dataclass(slots=True)
class Ack:
    """One acknowledged record: its number, where the broker put it, and when (monotonic)."""

    value: int
    partition: int
    offset: int
    at: float


class NumberedProducer:
    """Sends record i (value `str(i)`) to partition i % partitions at `rate` records/s."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float,
                 **config: Any) -> None:
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "acks": "all", "linger.ms": 5, "client.id": "proxy-faults",
                                  **config})
        self.acks: list[Ack] = []
        self.failures: list[tuple[int, str]] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="numbered-producer", daemon=True)

    def in_flight(self) -> int:
        """Sent (handed to librdkafka) and neither acknowledged nor failed yet."""
        return self.sent - len(self.acks) - len(self.failures)

    def acks_after(self, t: float) -> list[Ack]:
        return [a for a in self.acks if a.at > t]

    def start(self) -> NumberedProducer:
        self._thread.start()
        return self

    def _delivered(self, err: Any, msg: Any) -> None:
        value = int(msg.value())
        if err is not None:
            self.failures.append((value, str(err)))
        else:
            self.acks.append(Ack(value, msg.partition(), msg.offset(), time.monotonic()))

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due and not self._stop.is_set():
                i = self.sent
                try:
                    self.producer.produce(self.topic, value=str(i).encode(),
                                          partition=i % self.partitions, on_delivery=self._delivered)
                except BufferError:
                    break  # librdkafka's queue is full (proxy down for long): wait, then go on
                self.sent += 1
            self.producer.poll(0.005)

    def stop(self, flush_timeout: float = 60.0) -> int:
        """Stop sending and wait for every record's outcome; the number still undecided."""
        self._stop.set()
        self._thread.join(30)
        return int(self.producer.flush(flush_timeout))


class Reader:
    """A consumer through the proxy, assigned every partition from offset 0 (no group to join),
    keeping each partition's values in the order read."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "proxy-faults-reader",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                  "client.id": "proxy-faults-reader"})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.seen: dict[int, list[int]] = {p: [] for p in range(partitions)}
        self.read_at: list[float] = []  # when each record was read, in reading order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reader", daemon=True)

    def start(self) -> Reader:
        self._thread.start()
        return self

    def count(self) -> int:
        return len(self.read_at)

    def _run(self) -> None:
        while not self._stop.is_set():
            msg: Any = self.consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            self.seen[msg.partition()].append(int(msg.value()))
            self.read_at.append(time.monotonic())

    def wait_for(self, values: set[int], timeout: float) -> set[int]:
        """Wait until every one of `values` has been read; those still missing at `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            missing = values - {v for vs in list(self.seen.values()) for v in vs}
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def read_from_broker(address: str, topic: str, partitions: int,
                     timeout: float = 60.0) -> dict[int, list[tuple[int, int]]]:
    """Every record of `topic`, read directly from the broker: partition -> [(offset, value)].

    Read until each partition's Fetch reaches its high watermark (librdkafka's partition EOF),
    not up to ListOffsets' latest offset: Tansu answers that with the base offset of the last
    batch, which leaves the last batch unread."""
    consumer = Consumer({"bootstrap.servers": address, "group.id": "proxy-faults-check",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "client.id": "proxy-faults-check"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        records: dict[int, list[tuple[int, int]]] = {p: [] for p in range(partitions)}
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {sum(map(len, records.values()))} records of {topic}; "
                                   f"partitions {sorted(at_end)} of {partitions} at their end "
                                   f"after {timeout:.0f}s")
            msg: Any = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    continue
                raise RuntimeError(f"reading {topic} from the broker: {msg.error()}")
            at_end.discard(msg.partition())
            records[msg.partition()].append((msg.offset(), int(msg.value())))
        return records
    finally:
        consumer.close()


@dataclass
class Verdict:
    """What the broker holds against what was acknowledged."""

    acked: int
    at_broker: int
    lost: list[int] = field(default_factory=list)  # acknowledged, not at the broker
    duplicated: list[int] = field(default_factory=list)  # at the broker more than once
    out_of_order: list[int] = field(default_factory=list)  # partitions whose numbers do not rise
    misplaced: list[int] = field(default_factory=list)  # in another partition than sent to
    # Acknowledged without their real offset: a retried batch that had reached the broker before
    # the connection broke, answered DUPLICATE_SEQUENCE_NUMBER, which librdkafka reports as
    # delivered with offset -1 (+ the record's index in the batch). At the broker all the same.
    offset_unknown: int = 0

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.out_of_order or self.misplaced)


def check(acks: list[Ack], records: dict[int, list[tuple[int, int]]]) -> Verdict:
    partitions = len(records)
    where = {value: (p, offset) for p, rs in records.items() for offset, value in rs}
    values = [value for rs in records.values() for _, value in rs]
    verdict = Verdict(acked=len(acks), at_broker=len(values))
    verdict.lost = sorted(a.value for a in acks if a.value not in where)
    verdict.duplicated = sorted(v for v, n in Counter(values).items() if n > 1)
    verdict.out_of_order = [p for p, rs in records.items()
                            if any(a[1] >= b[1] for a, b in zip(rs, rs[1:], strict=False))]
    verdict.misplaced = sorted(v for v, (p, _) in where.items() if v % partitions != p)
    verdict.offset_unknown = sum(1 for a in acks if a.value in where
                                 and where[a.value] != (a.partition, a.offset))
    return verdict
