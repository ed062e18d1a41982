"""Where the demo's missing records went: each acknowledged record that neither the live consumer
nor the read back through the proxy found is looked up straight on the broker, at the partition
and offset the broker acknowledged for it, not through the proxy.

So a mismatch says which side lost it: "the broker acknowledged offset N and does not have it"
(the broker lost it; the proxy only carries the broker's answers) or "the broker has it" (the
proxy or the consumer passed over it)."""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from devkit.tansu import FIRST_OFFSET

# What a direct read found at an acknowledged offset.
ON_BROKER = "on the broker"  # the record, with its key, at the acknowledged offset
OTHER_RECORD = "another record at that offset"  # the broker gave the offset to another record
SKIPPED = "not on the broker: the log goes on past it"  # the offset is missing from the log
BEYOND_END = "not on the broker: its log ends before it"  # the high watermark is not past it
UNREAD = "not read: the broker did not answer in time"

BROKER_LOST = (OTHER_RECORD, SKIPPED, BEYOND_END)


@dataclass(frozen=True)
class Lookup:
    """One run of missing records: a partition's consecutive acknowledged offsets (first..last)
    and what a read straight from the broker found there, the same for each of them."""

    partition: int
    first: int
    last: int
    found: str
    detail: str = ""

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def line(self) -> str:
        where = (f"offset {self.first:,}" if self.first == self.last
                 else f"offsets {self.first:,}-{self.last:,} ({self.count:,} records)")
        detail = f" ({self.detail})" if self.detail else ""
        return f"partition {self.partition}, {where}: {self.found}{detail}"


def verdict(lookups: Iterable[Lookup]) -> str:
    """One line: whose loss it is, by what the broker itself holds."""
    lost = sum(x.count for x in lookups if x.found in BROKER_LOST)
    there = sum(x.count for x in lookups if x.found == ON_BROKER)
    unread = sum(x.count for x in lookups if x.found == UNREAD)
    parts = []
    if lost:
        parts.append(f"broker loss: the broker acknowledged {lost:,} record(s) it does not have")
    if there:
        parts.append(f"proxy or consumer loss: the broker has {there:,} record(s) that the reads "
                     "through the proxy did not return")
    if unread:
        parts.append(f"undecided: {unread:,} record(s) could not be read from the broker")
    return "cause: " + "; ".join(parts) if parts else "cause: none"


Records = list[tuple[int, int]]  # (offset, key) in one partition, by offset


def _by_partition(acked: dict[int, tuple[int, int]], missing: Iterable[int]) -> dict[int, Records]:
    """The missing records by partition, each partition's in offset order."""
    found: dict[int, Records] = {}
    for key in missing:
        partition, offset = acked[key]
        found.setdefault(partition, []).append((offset, key))
    return {p: sorted(found[p]) for p in sorted(found)}


def look_up(broker: str, topic: str, acked: dict[int, tuple[int, int]], missing: Iterable[int],
            seconds: float = 60.0) -> list[Lookup]:
    """Reads each missing record's acknowledged offset straight from `broker`. `acked` maps a
    record's key, as an integer (devkit.demo.clients.record_key), to the (partition, offset) the
    broker acknowledged for it. Consecutive offsets with the same finding come back as one
    Lookup.

    Each partition with a missing record is read from offset 0 (devkit.tansu.FIRST_OFFSET, not
    the broker's answer for "earliest") to its end: Tansu answers a Fetch past its log's end
    with nothing, no error, so a read that starts at a lost offset would wait without an
    answer, and its ListOffsets does not give the end either."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": broker, "client.id": "kqp-demo-direct-read",
                  "group.id": "kqp-demo-unused", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    found: list[Lookup] = []
    deadline = time.monotonic() + seconds
    try:
        for partition, records in _by_partition(acked, missing).items():
            wanted = {offset: key.to_bytes(8, "big") for offset, key in records}
            seen: dict[int, Any] = {}  # the keys at the wanted offsets
            offsets: list[int] = []  # every offset read past the first wanted one
            first = min(wanted)
            end: int | None = None  # the log's end, where the read reached it
            c.assign([TopicPartition(topic, partition, FIRST_OFFSET)])
            while end is None and time.monotonic() < deadline:
                for msg in c.consume(num_messages=1000, timeout=0.2):
                    err = msg.error()
                    offset = msg.offset() or 0
                    if err is None:
                        if offset in wanted:
                            seen[offset] = msg.key()
                        if offset > first:
                            offsets.append(offset)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        end = offset
            c.unassign()
            results = _judge(records, wanted, seen, sorted(offsets), end, seconds)
            found.extend(_same(partition, records, results))
    finally:
        c.close()
    return found


def _judge(records: Records, wanted: dict[int, bytes], seen: dict[int, Any], offsets: list[int],
           end: int | None, seconds: float) -> dict[int, tuple[str, str]]:
    """What the read found at each record's offset."""
    results: dict[int, tuple[str, str]] = {}
    for offset, _ in records:
        after = offsets[bisect.bisect_right(offsets, offset)] if offsets and offsets[-1] > offset else None
        if offset in seen:
            results[offset] = ((ON_BROKER, "") if seen[offset] == wanted[offset]
                               else (OTHER_RECORD, f"key {seen[offset]!r}"))
        elif after is not None:
            results[offset] = (SKIPPED, f"the next offset in the log is {after:,}")
        elif end is not None:
            results[offset] = (BEYOND_END, f"the log ends at offset {end:,}")
        else:
            results[offset] = (UNREAD, f"not at the end of the log after {seconds:g} s")
    return results


def _same(partition: int, records: Records, results: dict[int, tuple[str, str]]) -> list[Lookup]:
    """The records' offsets, consecutive ones found alike grouped into one Lookup."""
    out: list[Lookup] = []
    for offset, _ in records:
        found, detail = results[offset]
        prev = out[-1] if out else None
        if prev is not None and prev.found == found and prev.detail == detail and prev.last == offset - 1:
            out[-1] = Lookup(partition, prev.first, offset, found, detail)
        else:
            out.append(Lookup(partition, offset, offset, found, detail))
    return out
