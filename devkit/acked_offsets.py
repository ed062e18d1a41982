"""Every acknowledged record is in the broker's log, at the offset the broker acknowledged: a
check in many short rounds, directly against Tansu or through the proxy (docs/reliability.md,
"The demo under load").

It packs what the demo does around its one unexplained loss into rounds of a few seconds, so a
minute holds a dozen of the demo's risky moments instead of one: a topic created and written at
once, two producers with the demo's settings (not idempotent, acks=all, 64 KiB batches, five
requests in flight), one of them flat out and, through the proxy, held to a quota and its backlog
purged unsent at the end of the round, as the demo purges it. Each round then reads the topic
straight from Tansu (never through the proxy) past the highest acknowledged offset of every
partition, and counts:

- `shared`: acknowledged offsets given to two records (the broker gave one offset twice);
- `missing`: acknowledged records not in the log;
- `moved`: acknowledged records in the log at another offset than the one acknowledged.

    python -m devkit.acked_offsets --rounds 25                   # directly against Tansu
    python -m devkit.acked_offsets --rounds 25 --through-proxy   # the limited producer throttled
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.tansu import FIRST_OFFSET, tansu_and_proxy

PARTITIONS = 3
VALUE = b"x" * 1000  # the demo's 1 KiB records
LIMITED = "acked-offsets-limited"
QUOTA = 1 << 20  # bytes a second: the demo's quota for its limited producer
PRODUCING = {"acks": "all", "linger.ms": 10, "batch.size": 65536,
             "max.in.flight.requests.per.connection": 5, "queue.buffering.max.messages": 10_000}
READ_SECONDS = 60.0  # a read of the whole topic gives up after this
PROXY_CONFIG = {"quotas": [{"client-id": LIMITED, "producer_byte_rate": QUOTA}]}


@dataclass
class Round:
    """What one round saw: records acknowledged and read back, and what did not match."""

    topic: str
    acked: int = 0
    read: int = 0
    shared: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset)
    missing: list[tuple[int, int]] = field(default_factory=list)  # where each was acknowledged
    moved: list[tuple[int, int, int]] = field(default_factory=list)  # (partition, acked, found)
    purged: int = 0
    errors: int = 0
    read_whole: bool = True

    @property
    def ok(self) -> bool:
        return not (self.shared or self.missing or self.moved) and self.read_whole

    def line(self) -> str:
        text = (f"{self.topic}: {self.acked:,} acknowledged, {self.read:,} read back, "
                f"{len(self.shared)} offsets given twice, {len(self.missing)} missing, "
                f"{len(self.moved)} moved; {self.purged:,} purged unsent, {self.errors} errors")
        if not self.read_whole:
            text += f"; the read back did not reach every acknowledged offset in {READ_SECONDS:.0f} s"
        if self.missing:
            text += f"; first missing at (partition, offset) {sorted(self.missing)[:3]}"
        return text


def compare(acked: dict[bytes, tuple[int, int]], found: dict[bytes, tuple[int, int]]) -> Round:
    """Each acknowledged key's (partition, offset) against where the read back found it."""
    r = Round(topic="", acked=len(acked), read=len(found))
    r.shared = sorted(at for at, n in Counter(acked.values()).items() if n > 1)
    for key, at in acked.items():
        if key not in found:
            r.missing.append(at)
        elif found[key] != at:
            r.moved.append((at[0], at[1], found[key][1]))
    return r


class _Producer(threading.Thread):
    def __init__(self, address: str, topic: str, index: int, client_id: str, seconds: float,
                 purge_at_end: bool) -> None:
        super().__init__(name=f"producer-{index}", daemon=True)
        self.client: Any = Producer({"bootstrap.servers": address, "client.id": client_id, **PRODUCING})
        self.topic, self.index, self.seconds, self.purge_at_end = topic, index, seconds, purge_at_end
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.purged = 0
        self.errors = 0

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked[msg.key()] = (msg.partition(), msg.offset())
        elif err.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            self.purged += 1
        else:
            self.errors += 1

    def run(self) -> None:
        p, seq, end = self.client, 0, time.monotonic() + self.seconds
        while time.monotonic() < end:
            try:
                p.produce(self.topic, key=bytes([self.index]) + seq.to_bytes(4, "big"), value=VALUE,
                          on_delivery=self._delivered)
                seq += 1
            except BufferError:  # the queue is full: let it drain
                p.poll(0.05)
            p.poll(0)
        if self.purge_at_end:
            p.purge(in_queue=True, in_flight=False, blocking=True)
        if p.flush(20):
            p.purge(in_queue=True, in_flight=True, blocking=True)
            p.flush(5)


def read_all(address: str, topic: str, ends: dict[int, int]) -> tuple[dict[bytes, tuple[int, int]], bool]:
    """Every record of `topic` by key, read from offset 0 of each partition
    (devkit.tansu.FIRST_OFFSET) up to `ends` (one past the highest acknowledged offset), and
    whether it got that far."""
    c: Any = Consumer({"bootstrap.servers": address, "group.id": "acked-offsets-unused",
                       "enable.auto.commit": False})
    found: dict[bytes, tuple[int, int]] = {}
    reached = {p: ends.get(p, 0) <= 0 for p in range(PARTITIONS)}
    try:
        c.assign([TopicPartition(topic, p, FIRST_OFFSET) for p in range(PARTITIONS)])
        deadline = time.monotonic() + READ_SECONDS
        while not all(reached.values()) and time.monotonic() < deadline:
            for msg in c.consume(1000, 0.2):
                if msg.error() is not None:
                    continue
                found[msg.key()] = (msg.partition(), msg.offset())
                if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                    reached[msg.partition()] = True
    finally:
        c.close()
    return found, all(reached.values())


def one_round(address: str, broker_address: str, topic: str, seconds: float, limited: bool) -> Round:
    admin = AdminClient({"bootstrap.servers": address})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=20)[topic].result(30)
    producers = [_Producer(address, topic, 0, "acked-offsets-free", seconds, False),
                 _Producer(address, topic, 1, LIMITED, seconds, limited)]
    for p in producers:
        p.start()
    for p in producers:
        p.join(seconds + 60)
    acked = {k: v for p in producers for k, v in p.acked.items()}
    ends: dict[int, int] = {}
    for partition, offset in acked.values():
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    found, whole = read_all(broker_address, topic, ends)
    r = compare(acked, found)
    r.topic, r.read_whole = topic, whole
    r.purged = sum(p.purged for p in producers)
    r.errors = sum(p.errors for p in producers)
    return r


def run(rounds: int, seconds: float, through_proxy: bool, say: Any = print) -> list[Round]:
    done = []
    with tansu_and_proxy(through_proxy, PROXY_CONFIG) as (address, broker_address):
        for i in range(rounds):
            r = one_round(address, broker_address, f"acked-offsets-{i}", seconds, through_proxy)
            say(r.line())
            done.append(r)
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--seconds", type=float, default=4.0, help="each round's producing time")
    parser.add_argument("--through-proxy", action="store_true",
                        help=f"through the proxy, {LIMITED} held to {QUOTA:,} bytes/s and its "
                             "backlog purged at the end of each round")
    args = parser.parse_args()
    done = run(args.rounds, args.seconds, args.through_proxy)
    bad = [r for r in done if not r.ok]
    path = "through the proxy" if args.through_proxy else "directly against Tansu"
    print(f"{path}: {len(done) - len(bad)} of {len(done)} rounds with every acknowledged record "
          f"in the log where it was acknowledged ({sum(r.acked for r in done):,} records)")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
