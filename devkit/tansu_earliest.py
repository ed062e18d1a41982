"""Tansu answers ListOffsets(earliest) with the batch it stored first, not the lowest offset: a
reproduction, directly against Tansu (docs/reliability.md, "The demo under load").

Tansu (dynostore, the memory storage included) gives a Produce its offsets by moving the
partition's high watermark, and stores the batch afterwards. Its ListOffsets(earliest) answers
the base offset of the batch whose object is oldest (`last_modified`), not the lowest one. When
a connection's batch with higher offsets is stored before another's with lower ones, "earliest"
is past records the log holds, for good: every reader that starts at OFFSET_BEGINNING (or a
group's auto.offset.reset=earliest) passes over them, though a read from offset 0 finds them.

Each round creates a topic, and `--producers` librdkafka producers, on connections of their own,
write one record to every partition at once. Then each partition's earliest offset is asked
(librdkafka's get_watermark_offsets, a ListOffsets) and compared with 0; where it is not 0, the
partition is read from offset 0 to show the records are there. `--busy N` runs N busy loops
beside it: the reordering needs a thread descheduled between the two steps.

    python -m devkit.tansu_earliest --rounds 60 --busy 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.tansu import FIRST_OFFSET, Broker


@dataclass(frozen=True)
class Finding:
    """A partition whose earliest offset, as the broker answered it, is not where its log starts."""

    round: int
    partition: int
    earliest: int
    latest: int
    from_zero: list[int]  # the offsets a read from offset 0 returned

    def line(self) -> str:
        return (f"round {self.round}, partition {self.partition}: ListOffsets earliest {self.earliest}, "
                f"latest {self.latest}; a read from offset 0 returns offsets {self.from_zero}")


def _busy() -> None:
    while True:
        pass


def _write_at_once(bootstrap: str, topic: str, partitions: int, producers: int) -> None:
    """Each producer writes one record to every partition, all starting together."""
    clients = [Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1,
                         "enable.idempotence": False, "client.id": f"earliest-{i}"})
               for i in range(producers)]
    for p in clients:
        p.list_topics(topic, timeout=10)
    go = threading.Event()
    undelivered: list[int] = []  # producers whose records were not all delivered within 30 s

    def write(p: Any, index: int) -> None:
        go.wait()
        for partition in range(partitions):
            p.produce(topic, key=bytes([index]), value=b"x" * 100, partition=partition)
        if p.flush(30):
            undelivered.append(index)

    threads = [threading.Thread(target=write, args=(p, i)) for i, p in enumerate(clients)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    if undelivered:  # raised here, not in the thread, where it would only be printed
        raise RuntimeError(f"producers {sorted(undelivered)} could not deliver to {topic} within 30 s")


def _check(bootstrap: str, topic: str, partitions: int, round_: int) -> list[Finding]:
    c: Any = Consumer({"bootstrap.servers": bootstrap, "group.id": "earliest-unused",
                       "enable.auto.commit": False})
    found = []
    try:
        for partition in range(partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if low == FIRST_OFFSET:
                continue
            c.assign([TopicPartition(topic, partition, FIRST_OFFSET)])
            offsets: list[int] = []
            deadline = time.monotonic() + 5
            while len(offsets) < high and time.monotonic() < deadline:
                offsets += [m.offset() for m in c.consume(100, 0.2) if m.error() is None]
            c.unassign()
            found.append(Finding(round_, partition, low, high, offsets))
    finally:
        c.close()
    return found


def run(rounds: int, partitions: int, producers: int) -> tuple[list[Finding], int]:
    """The findings over `rounds` fresh topics, and how many partitions were asked."""
    broker = Broker().start()
    findings: list[Finding] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.address})
        for r in range(rounds):
            topic = f"earliest-{r}-{time.time_ns()}"
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
            _write_at_once(broker.address, topic, partitions, producers)
            new = _check(broker.address, topic, partitions, r)
            for f in new:
                print(f.line(), flush=True)
            findings += new
    finally:
        broker.stop()
    return findings, rounds * partitions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20, help="fresh topics, one after another")
    ap.add_argument("--partitions", type=int, default=32, help="partitions per topic")
    ap.add_argument("--producers", type=int, default=8, help="producers writing at once")
    ap.add_argument("--busy", type=int, default=0, help="busy loops beside it, to deschedule threads")
    a = ap.parse_args(argv)
    loops = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(a.busy)]
    for p in loops:
        p.start()
    try:
        findings, asked = run(a.rounds, a.partitions, a.producers)
    finally:
        for p in loops:
            p.terminate()
    held = sum(f.from_zero[:1] == [FIRST_OFFSET] for f in findings)
    print(f"{len(findings)} of {asked} partitions answered ListOffsets(earliest) past offset 0; "
          f"in {held} of them a read from offset 0 returns the records from offset 0 on")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
