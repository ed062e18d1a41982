"""The demo's sample clients, each a thread with its own confluent-kafka client: a producer
paced by a token bucket or producing flat out, and a consumer that reads every record back so
that nothing acknowledged goes missing unseen."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from typing import Any

from devkit.demo.counts import THROTTLE_WINDOW_SECONDS, ClientCounts, ProducerView, Throttle
from devkit.tansu import FIRST_OFFSET

FREE, LIMITED = "demo-free", "demo-limited"  # the producers' client-ids
STATS_SECONDS = 1.0  # librdkafka's statistics interval
FLUSH_SECONDS = 20.0  # how long a producer may take to finish what it has in flight at the end


def record_key(producer: int, seq: int) -> bytes:
    """8 bytes: which producer (the top byte) and its sequence number, so the consumer can tell
    every record apart."""
    return ((producer << 56) | seq).to_bytes(8, "big")


class SampleProducer(threading.Thread):
    """Produces `rate` records a second of `size` bytes (a token bucket, so it never bursts more
    than a tenth of a second's worth), or as fast as its client takes them if `rate` is None,
    until stopped. Then it either flushes, or (`purge_at_end`) drops what is still queued in the
    client, unsent, and waits only for the requests in flight.

    `acked_at` holds the keys the broker acknowledged, with where; records purged or failed are
    not in it."""

    def __init__(self, config: dict[str, Any], client_id: str, index: int, topic: str,
                 rate: int | None, size: int, quota: float | None, purge_at_end: bool) -> None:
        from confluent_kafka import Producer

        super().__init__(name=f"producer-{client_id}", daemon=True)
        self.client_id = client_id
        self.index = index
        self.topic = topic
        self.rate = rate
        self.quota = quota
        self.purge_at_end = purge_at_end
        self.payload = (b"kafka-quota-proxy demo " * (size // 23 + 1))[:size]
        self.halt = threading.Event()
        self.acked_at: dict[int, tuple[int, int]] = {}  # key -> the (partition, offset) acknowledged
        self.purged_in_flight: set[int] = set()  # sent, then given up on: on the broker or not
        self.records = 0
        self.bytes = 0
        self.errors = 0
        self.last_error = ""
        self.purged = 0
        self.unflushed = 0
        # its last statistics intervals (of STATS_SECONDS)
        self.throttles: deque[Throttle] = deque(maxlen=round(THROTTLE_WINDOW_SECONDS / STATS_SECONDS))
        self.throttle_max_seen = 0.0
        self.producer: Any = Producer({**config, "client.id": client_id, "stats_cb": self._stats})

    @property
    def key(self) -> str:
        return f"producer.{self.index}"

    @property
    def acked(self) -> set[int]:
        """The keys the broker acknowledged."""
        return set(self.acked_at)

    @property
    def throttle(self) -> Throttle:
        """What librdkafka reported over its last statistics intervals (THROTTLE_WINDOW_SECONDS)."""
        windows = list(self.throttles)
        count = sum(w.count for w in windows)
        return Throttle(max((w.max for w in windows), default=0.0),
                        sum(w.avg * w.count for w in windows) / count if count else 0.0, count)

    def view(self) -> ProducerView:
        note = f"paced {self.rate:,}/s" if self.rate is not None else "flat out"
        return ProducerView(self.client_id, self.key, self.quota,
                            ClientCounts(self.records, self.bytes, self.errors),
                            self.throttle, self.throttle_max_seen, note)

    def _delivered(self, err: Any, msg: Any) -> None:
        from confluent_kafka import KafkaError

        seq = int.from_bytes(msg.key(), "big")
        if err is not None:
            if err.code() == KafkaError._PURGE_QUEUE:
                self.purged += 1
            elif err.code() == KafkaError._PURGE_INFLIGHT:
                self.purged_in_flight.add(seq)
            else:
                self.errors += 1
                self.last_error = str(err)
            return
        self.acked_at[seq] = (msg.partition(), msg.offset())
        self.records += 1
        self.bytes += len(msg) + len(msg.key())

    def _stats(self, text: str) -> None:
        """librdkafka's statistics (every statistics.interval.ms, from poll): the throttle time
        the brokers (here, the proxy) reported in the last interval, per broker connection."""
        try:
            brokers = json.loads(text).get("brokers", {})
        except ValueError:
            return
        top, total, count = 0.0, 0.0, 0
        for broker in brokers.values():
            window = broker.get("throttle") or {}
            n = int(window.get("cnt", 0))
            if n:
                top = max(top, float(window.get("max", 0)))
                total += float(window.get("avg", 0)) * n
                count += n
        self.throttles.append(Throttle(top, total / count if count else 0.0, count))
        self.throttle_max_seen = max(self.throttle_max_seen, top)

    def run(self) -> None:
        p = self.producer
        seq = 0
        tokens = 0.0
        last = time.monotonic()
        while not self.halt.is_set():
            if self.rate is None:
                budget = 1000
            else:
                now = time.monotonic()
                tokens = min(tokens + (now - last) * self.rate, self.rate / 10)
                last = now
                budget = int(tokens)
            sent = 0
            while sent < budget and not self.halt.is_set():
                try:
                    p.produce(self.topic, key=record_key(self.index, seq), value=self.payload,
                              on_delivery=self._delivered)
                except BufferError:  # the client's queue is full: let it drain
                    p.poll(0.05)
                    break
                seq += 1
                sent += 1
            tokens -= sent
            p.poll(0 if self.rate is None else 0.005)
        if self.purge_at_end:  # the backlog a throttled client holds: drop it, unsent
            p.purge(in_queue=True, in_flight=False, blocking=True)
        self.unflushed = p.flush(FLUSH_SECONDS)
        if self.unflushed:  # still waiting on the broker: give up on those too (counted apart)
            p.purge(in_queue=True, in_flight=True, blocking=True)
            self.unflushed = p.flush(5)


class SampleConsumer(threading.Thread):
    """Reads every partition of the topic from offset 0 (devkit.tansu.FIRST_OFFSET, not the
    broker's answer for "earliest"), by manual assignment: no consumer group, so no wait for a
    group join."""

    def __init__(self, consumer: Any, topic: str, partitions: int) -> None:
        super().__init__(name="consumer", daemon=True)
        self.consumer = consumer
        self.topic = topic
        self.partitions = partitions
        self.halt = threading.Event()
        self.seen: set[int] = set()
        self.records = 0
        self.bytes = 0
        self.errors = 0
        self.duplicates = 0
        self.last_error = ""

    def counts(self) -> ClientCounts:
        return ClientCounts(len(self.seen), self.bytes, self.errors)

    def run(self) -> None:
        from confluent_kafka import TopicPartition

        c = self.consumer
        c.assign([TopicPartition(self.topic, p, FIRST_OFFSET) for p in range(self.partitions)])
        while not self.halt.is_set():
            for msg in c.consume(num_messages=1000, timeout=0.1):
                err = msg.error()
                if err is not None:
                    self.errors += 1
                    self.last_error = str(err)
                    continue
                key = msg.key()
                seq = int.from_bytes(key, "big")
                if seq in self.seen:
                    self.duplicates += 1
                else:
                    self.seen.add(seq)
                self.records += 1
                self.bytes += len(msg) + len(key)


class ReadBack(set[int]):
    """The record keys a read of the whole topic found; `complete` is False where it stopped at
    its deadline before the end of every partition (so a record it lacks may be in the log)."""

    complete = True
    seconds = 0.0  # how long the read took


def read_back(bootstrap: str, topic: str, partitions: int, seconds: float = 60.0) -> ReadBack:
    """Every record key's sequence in the topic, read with a fresh consumer from offset 0
    (devkit.tansu.FIRST_OFFSET) to the end it finds (through the proxy, as the demo's clients),
    for at most `seconds`."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "client.id": "kqp-demo-read-back",
                  "group.id": "kqp-demo-unused", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    seen = ReadBack()
    seen.complete = False
    started = time.monotonic()
    try:
        c.assign([TopicPartition(topic, p, FIRST_OFFSET) for p in range(partitions)])
        at_end: set[int] = set()
        deadline = time.monotonic() + seconds
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            msgs = c.consume(num_messages=1000, timeout=0.2)
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition() or 0)
                    continue
                at_end.discard(msg.partition() or 0)
                seen.add(int.from_bytes(msg.key() or b"", "big"))
            if msgs:
                quiet_since = time.monotonic()
            elif len(at_end) == partitions and time.monotonic() - quiet_since > 1.0:
                seen.complete = True
                break
    finally:
        c.close()
        seen.seconds = time.monotonic() - started
    return seen
