"""A librdkafka producer that records what was acknowledged over time, flat out or paced, and
proxy replicas to run it through: the load of the replica demo and of `bench.shared_accuracy`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.processes import ProxyProcess

RECORD = 1024


@dataclass
class Timeline:
    """(seconds since the common start, bytes acknowledged so far) every ~0.25 s."""

    marks: list[tuple[float, int]] = field(default_factory=list)
    errors: int = 0

    def at(self, t: float) -> int:
        done = 0
        for when, n in self.marks:
            if when > t:
                break
            done = n
        return done


def produce(bootstrap: str, topic: str, client_id: str, start: float, seconds: float, out: Timeline,
            pace: Callable[[float], float | None] = lambda elapsed: None,
            config: Mapping[str, object] | None = None) -> None:
    """Produce 1 KiB records from `start` (time.monotonic) for `seconds`; `pace(elapsed)` gives the
    bytes/s allowed at that moment, None for flat out; `config` adds to the producer's settings
    (SASL, a `throttle_cb`, say). The backlog left at the end is dropped (a throttled producer's
    queue is not the measurement); its records are not counted."""
    done = [0]

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            if getattr(err, "code", lambda: None)() != KafkaError._PURGE_QUEUE:
                out.errors += 1
        else:
            done[0] += RECORD

    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5, "acks": 1,
                  "batch.size": 128 * 1024, "queue.buffering.max.kbytes": 4096, **(config or {})})
    value = os.urandom(RECORD)
    sent_in_slot, slot = 0.0, -1
    next_mark = 0.0
    while time.monotonic() < start:
        time.sleep(0.01)
    while (elapsed := time.monotonic() - start) < seconds:
        allowed = pace(elapsed)
        if int(elapsed) != slot:
            slot, sent_in_slot = int(elapsed), 0.0
        if allowed is not None and sent_in_slot >= allowed * (elapsed - slot + 0.05):
            p.poll(0.01)
        else:
            try:
                p.produce(topic, value, on_delivery=delivered)
                sent_in_slot += RECORD
            except BufferError:
                p.poll(0.01)
            p.poll(0)
        if elapsed >= next_mark:
            out.marks.append((elapsed, done[0]))
            next_mark += 0.25
    p.purge(in_flight=False)
    p.flush(30)
    out.marks.append((time.monotonic() - start, done[0]))


def start_replicas(stack: ExitStack, upstream: str, node_id: int, count: int, config: dict,
                   topic: str) -> list[ProxyProcess]:
    """`count` proxy processes with the same config in front of one broker, stopped when `stack`
    closes, and a one-partition `topic` created through the first."""
    proxies = []
    for _ in range(count):
        p = ProxyProcess(upstream, node_id, extra_config=config).start()
        stack.callback(p.stop)
        proxies.append(p)
    admin = AdminClient({"bootstrap.servers": proxies[0].bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    return proxies


def fill(bootstrap: str, topic: str, megabytes: int, batch_bytes: int = 1024 * 1024) -> None:
    """`megabytes` MiB of 1 KiB records into partition 0 of `topic`, straight to the broker, in
    batches of up to `batch_bytes`: what `consume` readers read, more than a run can reach."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": 1,
                  "batch.size": batch_bytes, "queue.buffering.max.kbytes": 65536})
    value = os.urandom(RECORD)
    for _ in range(megabytes * 1024):
        while True:
            try:
                p.produce(topic, value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    if p.flush(120):
        raise RuntimeError(f"filling {topic}: records left unacknowledged")


def consume(bootstrap: str, topic: str, client_id: str, start: float, seconds: float, out: Timeline,
            pace: Callable[[float], float | None] = lambda elapsed: None) -> None:
    """Read partition 0 of `topic` from its start, from `start` for `seconds`, on its own (no
    group); `pace(elapsed)` as for `produce` (0: the partition is paused, so nothing is fetched).
    The prefetch queue is kept small; `out` counts the bytes of the records read. That is about
    what a flat-out consumer fetches, but less than a paced one does: librdkafka drops what it had
    fetched for a paused partition and fetches it again on resume (what a consumer quota counts,
    the replica's Fetch response bytes, is what bench.shared_accuracy measures)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "client.id": client_id, "group.id": client_id,
                  "enable.auto.commit": False, "fetch.max.bytes": 1024 * 1024,
                  "max.partition.fetch.bytes": 256 * 1024, "queued.max.messages.kbytes": 256})
    tp = TopicPartition(topic, 0, 0)
    c.assign([tp])
    paused = False
    done, sent_in_slot, slot, next_mark = 0, 0.0, -1, 0.0
    while time.monotonic() < start:
        time.sleep(0.01)
    try:
        while (elapsed := time.monotonic() - start) < seconds:
            allowed = pace(elapsed)
            if int(elapsed) != slot:
                slot, sent_in_slot = int(elapsed), 0.0
            hold = allowed is not None and sent_in_slot >= allowed * (elapsed - slot + 0.05)
            if hold != paused:
                (c.pause if hold else c.resume)([tp])
                paused = hold
            if paused:
                time.sleep(0.01)
            else:
                for msg in c.consume(100, 0.05):
                    if msg.error() is None:
                        done += len(msg.value() or b"")
                        sent_in_slot += len(msg.value() or b"")
            if elapsed >= next_mark:
                out.marks.append((elapsed, done))
                next_mark += 0.25
        out.marks.append((time.monotonic() - start, done))
    finally:
        c.close()
