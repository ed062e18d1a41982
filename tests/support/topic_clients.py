"""Producers for the topic quota tests: each writes numbered records to several topics, each topic
paced to its own bytes per second, and records what was acknowledged when; and the check that
every record of a topic reached the broker exactly once."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer, TopicPartition

KiB = 1024
# The quota counts record sets: batch and record headers are ~1% of 8 KiB, ~8% of 1 KiB.
RECORD = 8 * KiB


@dataclass
class Acks:
    """What one client saw acknowledged: (time since start, topic, bytes), and any error."""

    acked: list[tuple[float, str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)  # records produced per topic

    def rate(self, topic: str, start: float, end: float) -> float:
        """Bytes per second of the topic acknowledged from `start` to `end` (seconds since start)."""
        return sum(n for t, name, n in self.acked if name == topic and start <= t < end) / (end - start)


def produce_both(bootstrap: str, client: int, topics: dict[str, float], seconds: float, acks: Acks,
                 start: float, record: int = RECORD, max_unacked: int | None = None) -> None:
    """One client: records numbered per topic, each topic paced to its own bytes/s. Idempotent,
    and a refused batch is retried after at most 100 ms (librdkafka's default backoff grows to
    1 s, and a partition waiting for its refused batch sits idle after the topic has room).

    `max_unacked`: at most this many records of a topic produced and not yet acknowledged; the
    client falls behind its pace meanwhile and catches up when acknowledgements come, as a
    producer whose send blocks on a full buffer. None: the queue grows with all a held topic is
    offered over its quota, and the final flush pushes it through at the quota's rate."""
    p = Producer({"bootstrap.servers": bootstrap, "client.id": f"writer-{client}",
                  "enable.idempotence": True, "linger.ms": 20, "batch.size": 64 * KiB,
                  "retry.backoff.max.ms": 100})
    lock = threading.Lock()
    done = dict.fromkeys(topics, 0)

    def delivered(err: object, msg: object) -> None:
        with lock:
            done[msg.topic()] += 1  # type: ignore[attr-defined]
            if err is not None:
                acks.errors.append(str(err))
            else:
                value: bytes = msg.value()  # type: ignore[attr-defined]
                acks.acked.append((time.monotonic() - start, msg.topic(), len(value)))  # type: ignore[attr-defined]

    sent = dict.fromkeys(topics, 0)
    while (elapsed := time.monotonic() - start) < seconds:
        for topic, rate in topics.items():
            while sent[topic] * record < rate * elapsed:
                if max_unacked is not None and sent[topic] - done[topic] >= max_unacked:
                    break
                value = f"{client}:{sent[topic]}:".encode().ljust(record, b".")
                try:
                    p.produce(topic, value, key=str(sent[topic]).encode(), on_delivery=delivered)
                except BufferError:
                    break
                sent[topic] += 1
        p.poll(0.01)
    remaining = p.flush(90)
    acks.sent = sent
    if remaining:
        acks.errors.append(f"{remaining} records not delivered within 90 s of the end")


def read_all(bootstrap: str, topic: str, expected: int, partitions: int) -> list[bytes]:
    """Every record of the topic, straight from the broker: until `expected` have come and
    nothing more comes for 3 s (Tansu's high watermark lags its log, so it cannot say when)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    deadline = time.monotonic() + 90
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        got = [msg.value() for msg in c.consume(500, 0.5) if msg.error() is None]
        values += got
        if got:
            quiet_since = time.monotonic()
        elif len(values) >= expected and time.monotonic() - quiet_since > 3:
            break
    c.close()
    return values


def assert_each_once(values: list[bytes], results: list[Acks], topic: str) -> None:
    """Every record the clients of `results` (client i is `results[i]`) produced to the topic is
    among `values`, once."""
    seen = [tuple(v.split(b":")[:2]) for v in values]
    assert len(seen) == len(set(seen)), f"{topic}: {len(seen) - len(set(seen))} duplicates"
    wanted = {(str(i).encode(), str(n).encode()) for i, r in enumerate(results) for n in range(r.sent[topic])}
    missing = sorted((int(c), int(n)) for c, n in wanted - set(seen))
    assert set(seen) == wanted, f"{topic}: {len(missing)} missing, first {missing[:10]}"
