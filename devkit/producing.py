"""A librdkafka producer that records what was acknowledged over time, flat out or paced: the
load of the replica demo and of `bench.shared_accuracy`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Producer

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
            pace: Callable[[float], float | None] = lambda elapsed: None) -> None:
    """Produce 1 KiB records from `start` (time.monotonic) for `seconds`; `pace(elapsed)` gives the
    bytes/s allowed at that moment, None for flat out. The backlog left at the end is dropped
    (a throttled producer's queue is not the measurement); its records are not counted."""
    done = [0]

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            if getattr(err, "code", lambda: None)() != KafkaError._PURGE_QUEUE:
                out.errors += 1
        else:
            done[0] += RECORD

    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5, "acks": 1,
                  "batch.size": 128 * 1024, "queue.buffering.max.kbytes": 4096})
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
