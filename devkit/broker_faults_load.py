"""devkit.broker_faults' load: numbered records produced at a steady rate through the proxy, each
delivery (acknowledged or failed) kept in order, for reading back after the faults."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message, Producer

VALUE_BYTES = 100  # each record: its number, padded


@dataclass
class Delivery:
    seq: int
    partition: int
    offset: int | None  # None: librdkafka was told no offset
    at: float


class Load:
    """The idempotent producer and the consumer group, each on its own thread."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float,
                 group: bool = True) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.lock = threading.Lock()
        self.produced = 0
        self.acked: list[Delivery] = []
        self.failed: list[tuple[int, str]] = []
        self.consumed: set[int] = set()
        self.consumer_errors: list[str] = []
        self.flush_left: int | None = None
        self._producing = threading.Event()
        self._consuming = threading.Event()
        self._producer_thread = threading.Thread(target=self._produce, daemon=True)
        self._consumer_thread = threading.Thread(target=self._consume, daemon=True)

    def start(self) -> Load:
        self._producing.set()
        self._consuming.set()
        if self.group:
            self._consumer_thread.start()
        self._producer_thread.start()
        return self

    def in_flight(self) -> int:
        with self.lock:
            return self.produced - len(self.acked) - len(self.failed)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        seq = int(msg.value()[:12])  # type: ignore[index]
        with self.lock:
            if err is None:
                self.acked.append(Delivery(seq, msg.partition(), msg.offset(), time.monotonic()))  # type: ignore[arg-type]
            else:
                self.failed.append((seq, str(err)))

    def _produce(self) -> None:
        producer = Producer({
            "bootstrap.servers": self.bootstrap, "client.id": "faults-producer",
            "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            # Generous: a record is given up only if the broker is gone for minutes, never in
            # these faults.
            "message.timeout.ms": 300_000})
        start = time.monotonic()
        seq = 0
        while self._producing.is_set():
            due = start + seq / self.rate
            now = time.monotonic()
            if due > now:
                producer.poll(min(due - now, 0.05))
                continue
            value = f"{seq:012d}".encode().ljust(VALUE_BYTES, b".")
            try:
                producer.produce(self.topic, value=value, partition=seq % self.partitions,
                                 on_delivery=self._on_delivery)
            except BufferError:  # the local queue is full: wait for deliveries
                producer.poll(0.1)
                continue
            with self.lock:
                self.produced += 1
            seq += 1
            producer.poll(0)
        self.flush_left = producer.flush(360)

    def _consume(self) -> None:
        consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "client.id": "faults-consumer",
            "group.id": f"faults-{self.topic}", "auto.offset.reset": "earliest"})
        consumer.subscribe([self.topic])
        try:
            while self._consuming.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error() is not None:
                    self.consumer_errors.append(str(msg.error()))
                    continue
                with self.lock:
                    self.consumed.add(int(msg.value()[:12]))  # type: ignore[index]
        finally:
            consumer.close()

    def wait_acked(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.acked) >= count:
                    return True
            time.sleep(0.05)
        return False

    def wait_consumed(self, seqs: set[int], timeout: float) -> bool:
        """Whether the group has read every record of `seqs` within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if seqs <= self.consumed:
                    return True
            time.sleep(0.1)
        return False

    def stop_producing(self, timeout: float = 400) -> None:
        self._producing.clear()
        self._producer_thread.join(timeout)

    def stop_consuming(self, timeout: float = 60) -> None:
        self._consuming.clear()
        if self.group:
            self._consumer_thread.join(timeout)
