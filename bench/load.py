"""The benchmark's load generator: one workload against one address, in a process of its own.

    python -m bench.load produce --bootstrap HOST:PORT --topic T [--records N] [...]
    python -m bench.load fetch   --bootstrap HOST:PORT --topic T --offsets 0,1000,... [...]
    python -m bench.load latency --bootstrap HOST:PORT --topic T [--rate 1000] [...]
    python -m bench.load idle    --bootstrap HOST:PORT --connections 9000

It speaks the Kafka protocol on raw sockets, as a client would: Metadata on the bootstrap address
first, then connections to the partition leader that Metadata names (so through a proxy it uses
the broker address the proxy advertises). Each request is encoded once (bench.wire, with
kafka-python's message classes and MemoryRecordsBuilder); a run resends the same bytes with fresh
correlation ids, so the generator's CPU goes to its sockets, not to encoding, and it stays far
from being the bottleneck. Its own CPU time is part of what it reports, so that can be checked.

It writes JSON lines on stdout. `produce` and `fetch`: {"event": "open"} when the measured window
starts (after a warm-up), {"event": "close"} when it ends, then {"event": "result", ...}; the
harness samples the proxy's and the broker's CPU at the first two. `latency` writes the same
three. `idle` writes {"event": "ready", ...} once every connection has made its ApiVersions round
trip, holds the connections until a line (or the end) arrives on its stdin, then writes its result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.wire import (
    Check,
    Ring,
    api_versions_frame,
    check_fetch,
    check_metadata,
    check_produce,
    fetch_frame,
    host_port,
    leaders,
    metadata_frame,
    produce_frame,
    record_batch,
    round_trip,
)

READ_BUFFER = 1 << 18
# Every so many responses one is decoded whole and checked (correlation id, error codes, data):
# cheap enough not to cost the generator, often enough that a failing run cannot pass unseen.
CHECK_EVERY = 64


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def cpu_seconds() -> tuple[float, float]:
    """This process's (user, system) CPU seconds so far."""
    t = os.times()
    return t.user, t.system



# -- pipelined throughput -----------------------------------------------------------------------


class Pipelined(asyncio.BufferedProtocol):
    """One connection that keeps `inflight` requests outstanding: each response read sends the
    next request. Responses are counted as they stream past; only sampled ones are kept whole."""

    def __init__(self, ring: Ring, inflight: int, check: Check, errors: list[str]) -> None:
        self.ring = ring
        self.inflight = inflight
        self.check = check
        self.errors = errors
        self.buffer = memoryview(bytearray(READ_BUFFER))
        self.transport: asyncio.Transport | None = None
        self.head = b""  # a size prefix split across reads
        self.remaining = 0  # bytes of the current response still to come
        self.size = 0  # the current response's size
        self.kept: bytearray | None = None  # the current response, when it is one to check
        self.sent = 0
        self.responses = 0
        self.bytes = 0
        self.stopped = False
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send(self.inflight)

    def _send(self, n: int) -> None:
        if self.transport is not None and not self.stopped:
            self.transport.writelines(self.ring.take(self.sent, n))
            self.sent += n

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        data = self.buffer
        pos = 0
        done = 0
        while pos < nbytes:
            if self.remaining:
                take = min(self.remaining, nbytes - pos)
                if self.kept is not None:
                    self.kept += data[pos:pos + take]
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self._done()
                    done += 1
                continue
            if self.head or nbytes - pos < 4:
                take = min(4 - len(self.head), nbytes - pos)
                self.head += bytes(data[pos:pos + take])
                pos += take
                if len(self.head) < 4:
                    continue
                size = int.from_bytes(self.head, "big")
                self.head = b""
            else:
                size = int.from_bytes(data[pos:pos + 4], "big")
                pos += 4
            self.size = self.remaining = size
            if self.responses % CHECK_EVERY == 0:
                self.kept = bytearray(size.to_bytes(4, "big"))
        if done:
            self._send(done)

    def _done(self) -> None:
        if self.kept is not None:
            problem = self.check(bytes(self.kept), self.responses % self.ring.count)
            if problem is not None and len(self.errors) < 100:
                self.errors.append(problem)
            self.kept = None
        self.responses += 1
        self.bytes += 4 + self.size

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.stopped:
            self.errors.append(f"connection lost: {exc or 'closed by the other end'}")
        if not self.lost.done():
            self.lost.set_result(None)

    def stop(self) -> None:
        self.stopped = True
        if self.transport is not None:
            self.transport.abort()


async def pipelined_run(targets: Sequence[tuple[str, int]], rings: Sequence[Ring], inflight: int,
                        check: Check, warmup: float, seconds: float) -> dict[str, Any]:
    """Connections i = 0..len(rings)-1 to targets[i], each sending rings[i]; measured over `seconds`
    after `warmup`."""
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    conns: list[Pipelined] = []
    for (host, port), ring in zip(targets, rings, strict=True):
        _, conn = await loop.create_connection(lambda r=ring: Pipelined(r, inflight, check, errors),  # type: ignore[misc]
                                               host, port)
        sock = conn.transport.get_extra_info("socket") if conn.transport else None
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(conn)
    await asyncio.sleep(warmup)
    r0, b0 = sum(c.responses for c in conns), sum(c.bytes for c in conns)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    emit("open")
    await asyncio.sleep(seconds)
    r1, b1 = sum(c.responses for c in conns), sum(c.bytes for c in conns)
    cpu1, t1 = cpu_seconds(), time.perf_counter()
    emit("close")
    for c in conns:
        c.stop()
    elapsed = t1 - t0
    return {"seconds": elapsed, "requests": r1 - r0, "response_bytes": b1 - b0,
            "requests_per_second": (r1 - r0) / elapsed,
            "request_bytes_per_second": (r1 - r0) * rings[0].size / elapsed,
            "response_bytes_per_second": (b1 - b0) / elapsed,
            "connections": len(conns), "inflight": inflight,
            "request_bytes": rings[0].size, "checked": sum(c.responses for c in conns) // CHECK_EVERY,
            "errors": errors[:10], "error_count": len(errors),
            "generator_cpu_user": cpu1[0] - cpu0[0], "generator_cpu_system": cpu1[1] - cpu0[1]}


def client_ids(pattern: str, n: int) -> list[str]:
    """`pattern` with {i} for the connection's index: tenant-{i:03d} gives tenant-000, ..."""
    return [pattern.format(i=i) for i in range(n)]


def run_produce(args: argparse.Namespace) -> dict[str, Any]:
    where = leaders(args.bootstrap, args.topic, args.via_bootstrap)
    batch = record_batch(args.records, args.record_bytes)
    partitions = sorted(where)
    targets, rings = [], []
    # Big requests need few ring slots (memory); small ones many (fresh correlation ids).
    count = max(2 * args.inflight, min(1024, (64 << 20) // max(len(batch), 1) // args.connections))
    for i, client_id in enumerate(client_ids(args.client_id, args.connections)):
        p = partitions[i % len(partitions)]
        targets.append(where[p])
        rings.append(Ring.of([produce_frame(args.topic, p, batch, client_id)], count))
    result = asyncio_run(pipelined_run(targets, rings, args.inflight, check_produce, args.warmup,
                                       args.seconds))
    records = result["requests"] * args.records
    result.update(records=records, records_per_second=records / result["seconds"],
                  record_bytes_per_second=records * args.record_bytes / result["seconds"],
                  records_per_request=args.records, record_bytes=args.record_bytes, batch_bytes=len(batch))
    return result


def run_fetch(args: argparse.Namespace) -> dict[str, Any]:
    where = leaders(args.bootstrap, args.topic, args.via_bootstrap)
    offsets = [int(x) for x in args.offsets.split(",")]
    partitions = sorted(where)
    targets, rings = [], []
    count = max(2 * args.inflight, len(offsets))
    for i, client_id in enumerate(client_ids(args.client_id, args.connections)):
        p = partitions[i % len(partitions)]
        targets.append(where[p])
        # Each connection starts at its own place in the topic.
        start = i * len(offsets) // args.connections
        mine = offsets[start:] + offsets[:start]
        rings.append(Ring.of([fetch_frame(args.topic, p, o, args.max_bytes, client_id) for o in mine], count))
    result = asyncio_run(pipelined_run(targets, rings, args.inflight, check_fetch, args.warmup, args.seconds))
    result.update(max_bytes=args.max_bytes, offsets=len(offsets))
    return result


def run_metadata(args: argparse.Namespace) -> dict[str, Any]:
    """Pipelined Metadata requests for the topic, every connection to the bootstrap address: through
    the proxy, each answer is decoded and its broker addresses rewritten (a CPU-bound workload for
    the proxy when the broker answers from a cache, as bench.sink_broker does)."""
    frame = metadata_frame(args.topic, args.client_id)
    target = host_port(args.bootstrap)
    rings = [Ring.of([metadata_frame(args.topic, client_id)], max(2 * args.inflight, 64))
             for client_id in client_ids(args.client_id, args.connections)]
    result = asyncio_run(pipelined_run([target] * args.connections, rings, args.inflight,
                                       check_metadata, args.warmup, args.seconds))
    result.update(request_bytes=len(frame))
    return result


# -- latency ------------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def run_latency(args: argparse.Namespace) -> dict[str, Any]:
    """One request at a time on one connection, sent at a fixed rate; round trips timed with
    perf_counter on a blocking socket (no event loop between the wire and the clock)."""
    where = leaders(args.bootstrap, args.topic, args.via_bootstrap)
    batch = record_batch(args.records, args.record_bytes)
    ring = Ring.of([produce_frame(args.topic, 0, batch, args.client_id)], 1024)
    sock = socket.create_connection(where[0], timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    interval = 1.0 / args.rate
    samples: list[float] = []
    errors: list[str] = []
    late = 0
    n = 0
    start = time.perf_counter()
    open_at = start + args.warmup
    close_at = open_at + args.seconds
    opened = False
    cpu0 = cpu_seconds()
    t0 = start
    while True:
        due = start + n * interval
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
            now = time.perf_counter()
        elif now - due > interval:
            late += opened
        if now >= close_at:
            break
        if not opened and now >= open_at:
            opened = True
            cpu0, t0 = cpu_seconds(), now
            emit("open")
        sent = time.perf_counter()
        frame = round_trip(sock, ring.frame(n))
        took = time.perf_counter() - sent
        if opened:
            samples.append(took)
        if n % CHECK_EVERY == 0:
            problem = check_produce(frame, n % ring.count)
            if problem is not None:
                errors.append(problem)
        n += 1
    cpu1, t1 = cpu_seconds(), time.perf_counter()
    emit("close")
    sock.close()
    samples.sort()
    ms = [s * 1000 for s in samples]
    return {"seconds": t1 - t0, "requests": len(ms), "requests_per_second": len(ms) / (t1 - t0),
            "target_rate": args.rate, "late": late,
            "p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90), "p99_ms": percentile(ms, 99),
            "p999_ms": percentile(ms, 99.9), "max_ms": ms[-1] if ms else float("nan"),
            "mean_ms": sum(ms) / len(ms) if ms else float("nan"),
            "request_bytes": ring.size, "errors": errors[:10], "error_count": len(errors),
            "generator_cpu_user": cpu1[0] - cpu0[0], "generator_cpu_system": cpu1[1] - cpu0[1]}


# -- idle connections ---------------------------------------------------------------------------


async def _idle_connection(host: str, port: int, frame: bytes,
                           gate: asyncio.Semaphore) -> asyncio.StreamWriter:
    async with gate:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(frame)
        head = await reader.readexactly(4)
        await reader.readexactly(int.from_bytes(head, "big"))
        return writer


async def _idle(args: argparse.Namespace) -> dict[str, Any]:
    if args.topic:
        host, port = leaders(args.bootstrap, args.topic, args.via_bootstrap)[0]
    else:
        host, port = host_port(args.bootstrap)
    frame = api_versions_frame(args.client_id)
    gate = asyncio.Semaphore(args.concurrency)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    opening = [_idle_connection(host, port, frame, gate) for _ in range(args.connections)]
    results = await asyncio.gather(*opening, return_exceptions=True)
    writers = [w for w in results if isinstance(w, asyncio.StreamWriter)]
    failures = [r for r in results if isinstance(r, BaseException)]
    opened_in = time.perf_counter() - t0
    emit("ready", connections=len(writers), failed=len(failures),
         errors=sorted({f"{type(e).__name__}: {e}" for e in failures})[:5], seconds=opened_in)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    for w in writers:
        w.transport.abort()
    cpu1 = cpu_seconds()
    return {"connections": len(writers), "failed": len(failures), "open_seconds": opened_in,
            "generator_cpu_user": cpu1[0] - cpu0[0], "generator_cpu_system": cpu1[1] - cpu0[1]}


def run_idle(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio_run(_idle(args))


def asyncio_run(main: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


# -- command line -------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="workload", required=True)

    def common(s: argparse.ArgumentParser, topic_required: bool = True) -> None:
        s.add_argument("--bootstrap", required=True, help="HOST:PORT to ask for Metadata")
        s.add_argument("--topic", required=topic_required)
        s.add_argument("--client-id", default="bench-load",
                       help="client id; {i} is replaced by the connection's index")
        s.add_argument("--warmup", type=float, default=1.0, help="seconds before the measured window")
        s.add_argument("--seconds", type=float, default=5.0, help="the measured window")
        s.add_argument("--via-bootstrap", action="store_true",
                       help="connect to the bootstrap address, not the leader Metadata names (one broker)")

    s = sub.add_parser("produce", help="pipelined Produce requests, acks=1")
    common(s)
    s.add_argument("--connections", type=int, default=4)
    s.add_argument("--inflight", type=int, default=5, help="requests outstanding per connection")
    s.add_argument("--records", type=int, default=1000, help="records per request (one batch)")
    s.add_argument("--record-bytes", type=int, default=1024)
    s = sub.add_parser("fetch", help="pipelined Fetch requests at given offsets of a prepared topic")
    common(s)
    s.add_argument("--connections", type=int, default=4)
    s.add_argument("--inflight", type=int, default=5)
    s.add_argument("--offsets", required=True, help="fetch offsets, cycled: 0,1000,2000,...")
    s.add_argument("--max-bytes", type=int, default=1)
    s = sub.add_parser("metadata", help="pipelined Metadata requests to the bootstrap address")
    common(s)
    s.add_argument("--connections", type=int, default=16)
    s.add_argument("--inflight", type=int, default=4)
    s = sub.add_parser("latency", help="one Produce at a time at a fixed rate; round-trip percentiles")
    common(s)
    s.add_argument("--rate", type=float, default=1000.0, help="requests per second")
    s.add_argument("--records", type=int, default=1)
    s.add_argument("--record-bytes", type=int, default=1024)
    s = sub.add_parser("idle", help="open connections, one ApiVersions each, and hold them")
    common(s, topic_required=False)
    s.add_argument("--connections", type=int, default=1000)
    s.add_argument("--concurrency", type=int, default=200, help="connections being opened at once")
    return p


RUNS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "produce": run_produce, "fetch": run_fetch, "metadata": run_metadata, "latency": run_latency,
    "idle": run_idle}


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    result = RUNS[args.workload](args)
    emit("result", workload=args.workload, **result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
