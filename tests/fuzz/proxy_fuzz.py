"""Whole-proxy fuzz: mutated real sessions sent to a running proxy in front of Tansu, while an
idempotent producer on the same proxy sends a numbered sequence and a consumer reads it back.

    python -m tests.fuzz.proxy_fuzz [--seconds 300] [--senders 3] [--record sessions.log]

The sessions are built from the recorded corpus (tests/fuzz/corpus): the request frames real
clients sent, and the first bytes of their connections. Each session is one connection that
sends one of: valid frames with fuzzed bodies, recorded frames reordered, a recorded stream cut
at a random point, mutated streams, a valid frame followed by garbage, or garbage alone; then it
reads what comes back for a moment and closes. At the end: every record of the sequence was
delivered once and in order, the proxy is still running and answers Metadata, and its log
holds no traceback. Prints the counts and the proxy's protocol errors by kind (/metrics).

With --record, every session's bytes are written (and flushed) before they are sent, one line
each, and the moment Tansu dies is marked: `python -m tests.fuzz.isolate` replays such a file to
find the request that killed it.
"""

from __future__ import annotations

import argparse
import random
import re
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from devkit.processes import LOOPBACK, ProxyProcess
from devkit.tansu import Broker
from kafka_quota_proxy.protocol.framing import FrameDecoder
from tests.fuzz.mutate import mutate, seeds

PROTOCOL_ERRORS = "kafka_quota_proxy_protocol_errors_total"
# What an unhandled exception leaves in a log: Python's traceback, asyncio's callback and
# transport error reports, the event loop's "exception was never retrieved".
CRASH_MARKS = ("Traceback", "Exception in callback", "Fatal error", "exception was never retrieved",
               "Unhandled exception")
KINDS = ("fuzzed_bodies", "reordered", "cut", "mutated_stream", "valid_then_garbage", "garbage")


def _request_frames() -> list[bytes]:
    frames: list[bytes] = []
    for target in ("request_header", "produce", "fetch", "client_quotas"):
        frames += seeds(target)
    return frames


def _streams() -> list[bytes]:
    # framing inputs: a seed byte, then the first bytes of a recorded connection (either side);
    # the client's side starts with a request (api key below 100, so its second int16 is small).
    out = []
    for data in seeds("framing"):
        stream = data[1:]
        if len(stream) > 8 and stream[4] == 0:
            out.append(stream)
    return out


def _fuzz_body(frame: bytes, rng: random.Random, others: list[bytes]) -> bytes:
    """The frame's request header kept, its body mutated, its size prefix made right again."""
    n = struct.unpack_from(">h", frame, 12)[0] if len(frame) >= 14 else 0
    head_end = min(len(frame), 14 + max(n, 0))
    body = mutate(frame[head_end:], rng, others)
    payload = frame[4:head_end] + body
    return struct.pack(">i", len(payload)) + payload


@dataclass
class Tally:
    """What the fuzzing clients did."""

    sessions: int = 0
    frames: int = 0
    bytes_sent: int = 0
    closed_by_proxy: int = 0  # the proxy closed the connection before the client did
    answered: int = 0  # sessions that got at least one byte back
    kinds: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


class SessionLog:
    """Every session's bytes, written and flushed before they are sent, so that what a dead
    broker was sent survives it: one line per session, `<seconds> <port> <kind> <hex>`, and a
    `# broker died` line when the broker is seen dead."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.start = time.monotonic()
        self.lock = threading.Lock()

    def session(self, port: int, kind: str, data: bytes) -> None:
        with self.lock:
            self.out.write(f"{time.monotonic() - self.start:.3f} {port} {kind} {data.hex()}\n")
            self.out.flush()

    def note(self, text: str) -> None:
        with self.lock:
            self.out.write(f"# {time.monotonic() - self.start:.3f} {text}\n")
            self.out.flush()


def read_sessions(path: Path) -> list[tuple[float, int, str, bytes]]:
    """The sessions of a SessionLog file, in the order they were sent, up to the broker's death
    if it is marked (a session that started after it cannot have killed it)."""
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            if "broker died" in line:
                break
            continue
        at, port, kind, data = line.split(" ")
        out.append((float(at), int(port), kind, bytes.fromhex(data)))
    return out


def session(address: tuple[str, int], rng: random.Random, frames: list[bytes], streams: list[bytes],
            tally: Tally, record: SessionLog | None = None) -> None:
    kind = rng.choice(KINDS)
    if kind == "fuzzed_bodies":
        chosen = [_fuzz_body(rng.choice(frames), rng, frames) for _ in range(rng.randint(1, 5))]
        data = b"".join(chosen)
    elif kind == "reordered":
        stream = rng.choice(streams)
        try:
            chosen = [bytes(f) for f in FrameDecoder().feed(stream)]
        except Exception:  # noqa: BLE001 - a recorded stream always frames; be safe
            chosen = [stream]
        rng.shuffle(chosen)
        data = b"".join(chosen)
    elif kind == "cut":
        stream = rng.choice(streams)
        data = stream[:rng.randint(1, len(stream))]
        chosen = []
    elif kind == "mutated_stream":
        data = mutate(rng.choice(streams), rng, streams)
        chosen = []
    elif kind == "valid_then_garbage":
        chosen = [rng.choice(frames)]
        data = chosen[0] + rng.randbytes(rng.randint(1, 64))
    else:
        data = rng.randbytes(rng.randint(1, 256))
        chosen = []
    if record is not None:
        record.session(address[1], kind, data)
    closed = answered = False
    try:
        with socket.create_connection(address, timeout=2) as sock:
            sock.settimeout(0.3)
            pos = 0
            while pos < len(data):  # in random pieces, so frames arrive split as on a network
                step = rng.randint(1, 512)
                sock.sendall(data[pos:pos + step])
                pos += step
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:
                try:
                    got = sock.recv(65536)
                except TimeoutError:
                    break
                if not got:
                    closed = True
                    break
                answered = True
    except (ConnectionError, TimeoutError, OSError):
        closed = True
    with tally.lock:
        tally.sessions += 1
        tally.frames += len(chosen)
        tally.bytes_sent += len(data)
        tally.closed_by_proxy += closed
        tally.answered += answered
        tally.kinds[kind] += 1


@dataclass
class Delivery:
    """The idempotent producer's numbered sequence and what the consumer read back."""

    count: int = 0
    acked: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    consumed: list[int] = field(default_factory=list)


def produce_sequence(bootstrap: str, topic: str, stop: threading.Event, out: Delivery) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "max.in.flight.requests.per.connection": 5})

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            out.errors.append(str(err))
        else:
            out.acked.append(int(msg.value()))  # type: ignore[attr-defined]

    while not stop.is_set():
        p.produce(topic, value=str(out.count).encode(), on_delivery=delivered)
        out.count += 1
        p.poll(0.002)
    remaining = p.flush(60)
    if remaining:
        out.errors.append(f"{remaining} records not delivered within 60 s")


def consume_sequence(bootstrap: str, topic: str, expected: int, out: Delivery, timeout: float = 60) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    deadline = time.monotonic() + timeout
    try:
        while len(out.consumed) < expected and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.consumed.append(int(m.value()))
    finally:
        c.close()


def metadata_answered(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return bool(admin.list_topics(timeout=10).brokers)


def protocol_errors(metrics_text: str) -> dict[str, int]:
    found = re.findall(rf'^{PROTOCOL_ERRORS}{{kind="([^"]+)"}} ([0-9.e+]+)$', metrics_text, re.M)
    return {kind: int(float(value)) for kind, value in found}


@dataclass
class Report:
    seconds: float
    tally: Tally
    delivery: Delivery
    errors_by_kind: dict[str, int]
    proxy_alive: bool
    metadata_ok: bool
    crash_lines: list[str]
    log_path: str = ""
    broker_death: str = ""  # the end of Tansu's log, if Tansu itself died during the run

    def problems(self) -> list[str]:
        out = []
        d = self.delivery
        if d.errors:
            out.append(f"producer errors: {d.errors[:5]}")
        if d.acked != list(range(d.count)):
            out.append(f"acknowledged {len(d.acked)} of {d.count} records, in order: "
                       f"{d.acked == sorted(d.acked)}")
        if d.consumed != list(range(d.count)):
            out.append(f"consumed {len(d.consumed)} records of {d.count}, "
                       f"duplicates {len(d.consumed) - len(set(d.consumed))}, "
                       f"in order {d.consumed == sorted(d.consumed)}")
        if self.broker_death:
            out.append(f"Tansu (the broker) died during the run, so the records could not all be "
                       f"delivered; the end of its log: {self.broker_death}")
        if not self.proxy_alive:
            out.append("the proxy process died")
        if not self.metadata_ok:
            out.append("the proxy did not answer Metadata at the end")
        if self.crash_lines:
            out.append(f"the proxy's log has {len(self.crash_lines)} crash lines: {self.crash_lines[:3]}")
        return out

    def summary(self) -> str:
        t = self.tally
        lines = [
            f"{self.seconds:.0f} s: {t.sessions} fuzz sessions, {t.frames} whole frames, "
            f"{t.bytes_sent} bytes sent; {t.closed_by_proxy} closed by the proxy, {t.answered} answered",
            "sessions by kind: " + ", ".join(f"{k} {t.kinds[k]}" for k in KINDS),
            "protocol errors by kind (/metrics): " + (", ".join(
                f"{k} {v}" for k, v in sorted(self.errors_by_kind.items())) or "none"),
            f"idempotent producer: {self.delivery.count} records sent, {len(self.delivery.acked)} "
            f"acknowledged, {len(self.delivery.consumed)} consumed back",
            f"proxy alive: {self.proxy_alive}, Metadata answered at the end: {self.metadata_ok}, "
            f"crash lines in its log: {len(self.crash_lines)} ({self.log_path})",
        ]
        return "\n".join(lines)


def _start_proxy(broker: Broker, node_id: int, attempts: int = 3) -> ProxyProcess:
    """The proxy as a process; on a machine loaded enough that it does not listen within
    ProxyProcess's 20 s, tried again rather than the run lost."""
    for attempt in range(attempts):
        proxy = ProxyProcess(broker.address, node_id)
        try:
            return proxy.start()
        except TimeoutError:
            proxy.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def fuzz_proxy(broker: Broker, node_id: int, seconds: float, senders: int = 3, seed: int = 0,
               record: SessionLog | None = None) -> Report:
    """Run the whole-proxy fuzz against a fresh proxy in front of `broker`; with `record`,
    every session is logged before it is sent."""
    proxy = _start_proxy(broker, node_id)
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = f"fuzz-seq-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        frames, streams = _request_frames(), _streams()
        tally, delivery = Tally(), Delivery()
        stop = threading.Event()
        producer = threading.Thread(target=produce_sequence, args=(proxy.bootstrap, topic, stop, delivery))
        producer.start()
        start = time.monotonic()

        def sender(index: int) -> None:
            rng = random.Random(f"{seed}-{index}")
            # the bootstrap listener and the broker's own port both take the sessions
            addresses = [(LOOPBACK, proxy.port), (LOOPBACK, proxy.node_port)]
            while not stop.is_set():
                session(rng.choice(addresses), rng, frames, streams, tally, record)

        def watch_broker() -> None:
            while not stop.wait(0.05):
                if broker.stopped:
                    if record is not None:
                        record.note(f"broker died: {broker.log_tail(1)}")
                    return

        threads = [threading.Thread(target=sender, args=(i,)) for i in range(senders)]
        threads.append(threading.Thread(target=watch_broker))
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(30)
        producer.join(90)
        elapsed = time.monotonic() - start
        consume_sequence(proxy.bootstrap, topic, delivery.count, delivery)
        alive = proxy.proc is not None and proxy.proc.poll() is None
        broker_death = broker.log_tail(4) if broker.stopped else ""
        try:
            metadata_ok = alive and metadata_answered(proxy.bootstrap)
        except Exception:  # noqa: BLE001 - a KafkaException: no Metadata answer
            metadata_ok = False
        errors = protocol_errors(proxy.metrics()) if alive else {}
        log = proxy.log_text()
        crash_lines = [line for line in log.splitlines() if any(m in line for m in CRASH_MARKS)]
        return Report(elapsed, tally, delivery, errors, alive, metadata_ok, crash_lines, str(proxy.log_path),
                      broker_death)
    finally:
        proxy.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description="Whole-proxy fuzz (make fuzz-proxy).")
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--senders", type=int, default=3, help="fuzzing clients side by side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", type=Path, help="log every session's bytes to this file (SessionLog)")
    args = parser.parse_args()
    broker = Broker().start()
    out = args.record.open("w") if args.record else None
    try:
        record = SessionLog(out) if out is not None else None
        report = fuzz_proxy(broker, broker.node_id(), args.seconds, args.senders, args.seed, record)
    finally:
        broker.stop()
        if out is not None:
            out.close()
    print(report.summary())
    problems = report.problems()
    for problem in problems:
        print("PROBLEM:", problem)
    print("OK: nothing lost, no crash" if not problems else "FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
