"""Tansu answers a Fetch without a batch it has not stored yet: a reproduction, directly against
Tansu or through the proxy (docs/reliability.md, "Soak").

Tansu (dynostore, the memory storage included) gives a Produce its offsets by moving the
partition's high watermark, and stores the batch afterwards. A Fetch in between lists the batches
below the high watermark that are stored, and returns those from the fetch offset on: when
another connection's later batch is already stored, the answer starts past the fetch offset, or
has a hole where the batch not yet stored belongs. A consumer takes the offsets it gets as its
position, so the missing batch is passed over, although it is in the log a moment later.

Several idempotent librdkafka producers write to one partition, each on its own connection,
while two readers follow the partition's end: one sends Fetch requests itself and reports every
answer with offsets missing (Tansu's answer itself: a batch starting past the fetch offset, or
past the end of the batch before it), the other is a librdkafka consumer (assigned, no group, as
the soak's plain-fetch reader) that reports every jump in the offsets it returns. At the end
each range passed over is read again.

    python -m devkit.tansu_fetch_gap --seconds 60               # directly against Tansu
    python -m devkit.tansu_fetch_gap --seconds 60 --through-proxy
    python -m devkit.tansu_fetch_gap --debug-log reader.log     # librdkafka's fetch log, jumps marked
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

from devkit.tansu import tansu_and_proxy
from kafka_quota_proxy.protocol.headers import frame_request

TOPIC = "fetch-gap"
FETCH_VERSION = 12  # the newest that names topics; flexible, so a response header has tags
VALUE = b"x" * 512
_BATCH_HEAD = struct.Struct(">qi")  # base offset, batch length
LAST_OFFSET_DELTA_AT = 23  # in a v2 record batch


@dataclass
class Found:
    """What one run saw: the offsets missing from Tansu's answers (the first missing, the offset
    the answer went on at, the high watermark), the librdkafka reader's jumps (expected, got), and
    whether each range passed over was in the log when read again."""

    answers: list[tuple[int, int, int]] = field(default_factory=list)
    jumps: list[tuple[int, int]] = field(default_factory=list)
    reread: list[tuple[int, int, bool]] = field(default_factory=list)
    fetches: int = 0
    read: int = 0


def batches(records: bytes) -> Iterator[tuple[int, int]]:
    """(base offset, record count) of each whole v2 batch in a Fetch response's records."""
    at = 0
    while at + LAST_OFFSET_DELTA_AT + 4 <= len(records):
        base, length = _BATCH_HEAD.unpack_from(records, at)
        if at + 12 + length > len(records):
            return  # a partial batch at the end, as a broker may send
        (delta,) = struct.unpack_from(">i", records, at + LAST_OFFSET_DELTA_AT)
        yield base, delta + 1
        at += 12 + length


class WireReader:
    """Fetch requests of its own on one connection: partition 0 from `offset`, 500 ms long polls."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation_id = 0

    def fetch(self, offset: int) -> tuple[list[tuple[int, int]], int]:
        """The batches of the answer, and the high watermark it gave."""
        t = FetchRequest.FetchTopic
        wanted = t.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                  log_start_offset=-1, partition_max_bytes=1 << 20)
        req = FetchRequest(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[],
                           rack_id="", topics=[t(topic=TOPIC, partitions=[wanted])])
        self.correlation_id += 1
        self.sock.sendall(frame_request(req, FETCH_VERSION, self.correlation_id, "fetch-gap-wire"))
        (size,) = struct.unpack(">i", self._exactly(4))
        data = self._exactly(size)
        response: Any = FetchResponse.decode(data[5:], version=FETCH_VERSION)  # correlation id, tags
        part = response.responses[0].partitions[0]
        return list(batches(part.records or b"")), part.high_watermark

    def _exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return bytes(out)

    def close(self) -> None:
        self.sock.close()


def _produce(address: str, rate: float, stop: threading.Event) -> None:
    p: Any = Producer({"bootstrap.servers": address, "enable.idempotence": True, "linger.ms": 5})
    sent, start = 0, time.monotonic()
    while not stop.is_set():
        if sent < rate * (time.monotonic() - start):
            try:
                p.produce(TOPIC, VALUE, partition=0)
                sent += 1
            except BufferError:
                p.poll(0.01)
            p.poll(0)
        else:
            p.poll(0.002)
    p.flush(30)


def _follow_on_the_wire(address: str, stop: threading.Event, found: Found, say: Any) -> None:
    wire = WireReader(address)
    offset = 0
    try:
        while not stop.is_set():
            asked = offset
            got, high_watermark = wire.fetch(asked)
            found.fetches += 1
            for base, count in got:  # Tansu may send a batch twice in one answer: skipped
                if base > offset:
                    found.answers.append((offset, base, high_watermark))
                    say(f"Fetch at offset {asked}: offsets {offset}..{base - 1} missing from the "
                        f"answer, which goes on at {base} (high watermark {high_watermark})")
                offset = max(offset, base + count)
    finally:
        wire.close()


class _DebugLog:
    """librdkafka's log lines (`debug: fetch,consumer`) into a file, where the jumps are marked."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "w")  # noqa: SIM115 - closed by the reader that owns it
        self.lock = threading.Lock()

    def log(self, level: int, message: str, *args: Any) -> None:
        with self.lock:
            self.file.write((message % args if args else message) + "\n")


def _follow_with_librdkafka(address: str, stop: threading.Event, found: Found, say: Any,
                            debug_log: Path | None = None) -> None:
    debug = _DebugLog(debug_log) if debug_log is not None else None
    c: Any = Consumer({"bootstrap.servers": address, "group.id": "fetch-gap-unused",
                       "enable.auto.commit": False, "auto.offset.reset": "earliest",
                       **({"debug": "fetch,consumer", "logger": debug} if debug else {})})
    c.assign([TopicPartition(TOPIC, 0, 0)])
    expected = 0
    try:
        while not stop.is_set():
            for msg in c.consume(1000, 0.2):
                if msg.error() is not None:
                    continue
                if msg.offset() != expected:
                    found.jumps.append((expected, msg.offset()))
                    say(f"librdkafka reader: offset {expected} expected, {msg.offset()} returned")
                    if debug is not None:
                        debug.log(0, f"##### offset {expected} expected, {msg.offset()} returned")
                expected = msg.offset() + 1
                found.read += 1
    finally:
        c.close()
        if debug is not None:
            debug.file.close()


def _present(address: str, first: int, end: int) -> bool:
    """Whether offsets first..end-1 of partition 0 are all there, read by a fresh consumer."""
    c: Any = Consumer({"bootstrap.servers": address, "group.id": "fetch-gap-reread"})
    c.assign([TopicPartition(TOPIC, 0, first)])
    offsets: list[int] = []
    deadline = time.monotonic() + 10
    try:
        while len(offsets) < end - first and time.monotonic() < deadline:
            offsets += [m.offset() for m in c.consume(end - first, 0.5) if m.error() is None]
        return offsets[: end - first] == list(range(first, end))
    finally:
        c.close()


def run(seconds: float, producers: int, rate: float, through_proxy: bool, say: Any = print,
        debug_log: Path | None = None) -> Found:
    found = Found()
    with tansu_and_proxy(through_proxy) as (address, broker_address):
        admin = AdminClient({"bootstrap.servers": address})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        stop, done = threading.Event(), threading.Event()
        writers = [threading.Thread(target=_produce, args=(address, rate, stop), daemon=True)
                   for _ in range(producers)]
        readers = [
            threading.Thread(target=_follow_on_the_wire, args=(address, done, found, say), daemon=True),
            threading.Thread(target=_follow_with_librdkafka, args=(address, done, found, say, debug_log),
                             daemon=True)]
        for t in writers + readers:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in writers:
            t.join(60)
        time.sleep(2.0)  # the readers take the last records
        done.set()
        for t in readers:
            t.join(30)
        ranges = sorted({(a, b) for a, b, _ in found.answers} | set(found.jumps))
        for first, end in ranges:
            found.reread.append((first, end, _present(broker_address, first, end)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--producers", type=int, default=6, help="each on its own connection")
    parser.add_argument("--rate", type=float, default=500.0, help="records a second, each producer")
    parser.add_argument("--through-proxy", action="store_true")
    parser.add_argument("--debug-log", type=Path,
                        help="write the librdkafka reader's fetch log here, its jumps marked #####")
    args = parser.parse_args()
    found = run(args.seconds, args.producers, args.rate, args.through_proxy, debug_log=args.debug_log)
    for first, end, there in found.reread:
        print(f"offsets {first}..{end - 1}: {'in the log' if there else 'NOT in the log'} when read again")
    print(f"{'through the proxy' if args.through_proxy else 'directly against Tansu'}: "
          f"{len(found.answers)} holes in {found.fetches} Fetch answers; "
          f"the librdkafka reader returned {found.read} records and jumped {len(found.jumps)} times")


if __name__ == "__main__":
    main()
