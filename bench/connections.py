"""Load and hostile clients against one kafka-quota-proxy in front of one Tansu
(docs/reliability.md, "Load and hostile clients"). Measured and printed; the short versions in
tests/bench/test_connections.py assert what must hold (all served, limits kept, memory bounded).

    python -m bench.connections hold   [--connections 10000] [--active 20] [--seconds 10] [--workers 2]
    python -m bench.connections flood  [--rate 2000] [--seconds 10] [--limit-rate 200] [--max-per-ip 500]
                                       [--generators 4]
    python -m bench.connections slow   [--slowloris 1000] [--max-frame-bytes 8388608]
    python -m bench.connections all    (what `make load` runs)

`hold` runs the proxy with `--workers 2` by default: each worker then holds about half of the
connections, two descriptors each, under the per-process limit (20,000 here, which one process
could not fit 10,000 pairs under). `flood` and `slow` run one process (`--workers 1`), whose
bounds they measure. The clients are asyncio raw sockets speaking the Kafka protocol with
bench.wire's frames, all in this one process, but the flood, offered from `--generators`
processes of their own. The proxy's (summed over its workers) and Tansu's memory and descriptors
are read with psutil. Each run prints one JSON object per measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.connections_stack import (
    MIB,
    OTHER_SOURCE,
    TOPIC,
    Active,
    Stack,
    connect,
    emit,
    open_idle,
    raise_fd_limit,
    round_trip,
    stack,
)
from bench.load import asyncio_run, percentile
from bench.wire import (
    api_versions_frame,
    fetch_frame,
    produce_frame,
    record_batch,
)

# -- 1. many connections held -----------------------------------------------------------------------


async def hold(s: Stack, connections: int, active: int, rate: float, seconds: float) -> dict[str, Any]:
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    procs = s.serving()
    base_fds = max(p.num_fds() for p in procs)
    # Each client connection costs the proxy two descriptors: the client's and its own upstream;
    # each worker has the limit to itself. (The kernel spreads connections over the workers
    # unevenly, so with several a little of this room is in the wrong worker.)
    capacity = len(procs) * ((limit - base_fds - 32) // 2) - active
    held = min(connections, capacity)
    if held < connections:
        emit("hold-capped", asked=connections, held=held, fd_hard_limit=limit, proxy_base_fds=base_fds,
             workers=len(procs),
             why="the proxy needs two descriptors per client connection; the hard RLIMIT_NOFILE "
                 "cannot be raised without CAP_SYS_RESOURCE")
    clients = await Active(s.proxy.port, active, rate).open()
    await clients.measure(2.0)  # warm-up
    before = s.sample()
    rss_before = s.rss()
    quiet = await clients.measure(seconds)
    started = time.perf_counter()
    writers, failures = await open_idle(s.proxy.port, held)
    opened_in = time.perf_counter() - started
    await asyncio.sleep(2.0)
    with_held = s.sample()
    rss_held = s.rss()
    loaded = await clients.measure(seconds)
    after_active = s.sample()
    for w in writers:
        w.transport.abort()
    clients.close()
    await asyncio.sleep(3.0)
    after = s.sample()
    result = {
        "workers": len(procs),
        "held": len(writers), "held_failed": len(failures), "first_failures": sorted(set(failures))[:3],
        "open_seconds": round(opened_in, 1), "active_connections": active,
        "active_rate_per_connection": rate, "seconds": seconds,
        "before": before, "with_held": with_held, "after_active": after_active, "after_close": after,
        "proxy_bytes_per_connection": round((rss_held - rss_before) / max(len(writers), 1)),
        "active_without": quiet, "active_with": loaded,
        "p50_ratio": round(loaded["p50_ms"] / quiet["p50_ms"], 2),
        "p99_ratio": round(loaded["p99_ms"] / quiet["p99_ms"], 2),
        "proxy_alive": s.alive,
    }
    emit("hold", **result)
    return result


# -- 2. a connection flood ------------------------------------------------------------------------


class FloodConnection(asyncio.Protocol):
    """Connects, sends ApiVersions, and records what happened: answered, or closed unanswered
    (and after how long)."""

    def __init__(self, frame: bytes, outcome: asyncio.Future[tuple[str, float]]) -> None:
        self.frame = frame
        self.outcome = outcome
        self.got = 0
        self.start = time.perf_counter()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.start = time.perf_counter()
        transport.write(self.frame)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= 4 and not self.outcome.done():
            self.outcome.set_result(("served", time.perf_counter() - self.start))
            assert self.transport is not None
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.outcome.done():
            self.outcome.set_result(("closed", time.perf_counter() - self.start))


async def offer(port: int, rate: float, seconds: float) -> dict[str, Any]:
    """New connections at `rate` a second for `seconds`, each sending ApiVersions: what became of
    them. Run in a process of its own (`flood` starts it), so that the clients measured beside it
    do not share its event loop."""
    loop = asyncio.get_running_loop()
    frame = api_versions_frame("flood")
    outcomes: list[asyncio.Future[tuple[str, float]]] = []
    failed: list[str] = []
    tasks: set[asyncio.Task[Any]] = set()

    async def one() -> None:
        outcome: asyncio.Future[tuple[str, float]] = loop.create_future()
        outcomes.append(outcome)
        try:
            transport, _ = await asyncio.wait_for(loop.create_connection(
                lambda: FloodConnection(frame, outcome), "127.0.0.1", port), 10)
        except (OSError, TimeoutError) as exc:
            failed.append(f"{type(exc).__name__}: {exc}")
            outcome.set_result(("not connected", 0.0))
            return
        try:
            await asyncio.wait_for(asyncio.shield(outcome), 30)
        except TimeoutError:
            transport.abort()
            outcome.set_result(("no answer in 30 s", 30.0))

    started = time.perf_counter()
    n = 0
    while (now := time.perf_counter()) - started < seconds:
        due = int((now - started) * rate)
        while n < due:
            t = loop.create_task(one())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            n += 1
        await asyncio.sleep(0.001)
    offered_for = time.perf_counter() - started
    while tasks:
        await asyncio.gather(*tasks)
    counts: dict[str, int] = {}
    closed_after: list[float] = []
    for o in outcomes:
        kind, after = o.result()
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "closed":
            closed_after.append(after * 1000)
    closed_after.sort()
    return {
        "offered": len(outcomes), "offered_per_second": round(len(outcomes) / offered_for, 1),
        "seconds": round(offered_for, 2), "outcomes": counts,
        "served_per_second": round(counts.get("served", 0) / offered_for, 1),
        # From the client's side: the time in the listen backlog counts too.
        "closed_within_10ms": sum(1 for c in closed_after if c < 10),
        "closed_after_ms_p50": round(percentile(closed_after, 50), 1) if closed_after else None,
        "closed_after_ms_max": round(closed_after[-1], 1) if closed_after else None,
        "first_connect_failures": sorted(set(failed))[:3],
    }


def proxy_cpu_seconds(s: Stack) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in s.serving()))


async def flood(s: Stack, rate: float, seconds: float, limit_rate: int, max_per_ip: int,
                active: int, active_rate: float, generators: int = 1) -> dict[str, Any]:
    """New connections at `rate` a second from 127.0.0.1, offered by `generators` processes (each
    `rate / generators`: one Python process opened no more than about 1,550 a second here),
    while `active` clients from another address are measured."""
    clients = await Active(s.proxy.port, active, active_rate, source=OTHER_SOURCE).open()
    await clients.measure(2.0)
    quiet = await clients.measure(seconds)
    cpu0 = proxy_cpu_seconds(s)
    children = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.connections", "offer", "--port", str(s.proxy.port),
        "--rate", str(rate / generators), "--seconds", str(seconds), stdout=asyncio.subprocess.PIPE)
        for _ in range(generators)]
    during = await clients.measure(seconds)
    outs = [(await child.communicate())[0] for child in children]
    cpu1 = proxy_cpu_seconds(s)
    clients.close()
    offered = combine_offers([json.loads(out) for out in outs])
    result = {
        **offered, "generators": generators, "connection_creation_rate": limit_rate,
        "max_connections_per_ip": max_per_ip,
        "proxy_cpu_seconds": round(cpu1 - cpu0, 1),
        "accept_throttle_ms_metric": s.proxy.metric(
            "kafka_quota_proxy_connection_accept_throttle_time_ms_total", ip="127.0.0.1"),
        "other_source": OTHER_SOURCE, "other_without_flood": quiet, "other_with_flood": during,
        "p99_ratio": round(during["p99_ms"] / quiet["p99_ms"], 2),
        "proxy_alive": s.alive, "after": s.sample(),
    }
    emit("flood", **result)
    return result


def combine_offers(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The generators' reports as one: counts added, the longest window, the worst delays."""
    if len(parts) == 1:
        return parts[0]
    seconds = max(p["seconds"] for p in parts)
    outcomes: dict[str, int] = {}
    for p in parts:
        for kind, n in p["outcomes"].items():
            outcomes[kind] = outcomes.get(kind, 0) + n
    offered = sum(p["offered"] for p in parts)
    medians = [p["closed_after_ms_p50"] for p in parts if p["closed_after_ms_p50"] is not None]
    maxima = [p["closed_after_ms_max"] for p in parts if p["closed_after_ms_max"] is not None]
    return {
        "offered": offered, "offered_per_second": round(offered / seconds, 1), "seconds": seconds,
        "outcomes": outcomes, "served_per_second": round(outcomes.get("served", 0) / seconds, 1),
        "closed_within_10ms": sum(p["closed_within_10ms"] for p in parts),
        "closed_after_ms_p50_per_generator": medians, "closed_after_ms_max": max(maxima, default=None),
        "first_connect_failures": sorted({f for p in parts for f in p["first_connect_failures"]})[:3],
        "per_generator_offered_per_second": [p["offered_per_second"] for p in parts],
    }


def flood_config(limit_rate: int, max_per_ip: int) -> dict[str, Any]:
    return {"quota": {"max_connections_per_ip": max_per_ip},
            "quotas": [{"ip": "<default>", "connection_creation_rate": limit_rate}]}


# -- 3. slow readers and writers ------------------------------------------------------------------


async def settle(s: Stack, seconds: float = 2.0) -> int:
    await asyncio.sleep(seconds)
    return s.rss()


async def slowloris(s: Stack, connections: int, max_frame_bytes: int, seconds: float,
                    interval: float) -> dict[str, Any]:
    """Connections that each declare a frame of max_frame_bytes - 1 and send it a byte every
    `interval` seconds."""
    rss0 = await settle(s, 1.0)
    conns = [await connect(s.proxy.port) for _ in range(connections)]
    prefix = (max_frame_bytes - 1).to_bytes(4, "big")
    for _, w in conns:
        w.write(prefix)
    started = time.perf_counter()
    sent = 0
    while time.perf_counter() - started < seconds:
        for _, w in conns:
            w.write(b"\x00")
            sent += 1
        await asyncio.sleep(interval)
    rss1 = await settle(s, 1.0)
    open_before = s.proxy.metric("kafka_quota_proxy_connections_open")
    for _, w in conns:
        w.transport.abort()
    result = {"connections": connections, "seconds": seconds, "byte_every_s": interval,
              "bytes_trickled": sent, "connections_open": open_before,
              "proxy_rss_growth_mib": round((rss1 - rss0) / MIB, 2),
              "proxy_bytes_per_connection": round((rss1 - rss0) / connections), "proxy_alive": s.alive}
    emit("slowloris", **result)
    return result


async def trickle(s: Stack, max_frame_bytes: int, seconds: float) -> dict[str, Any]:
    """One connection sending a large frame as fast as it can in one-byte writes (TCP_NODELAY):
    the proxy reads tiny chunks; what it holds should be about the bytes received."""
    rss0 = await settle(s, 1.0)
    sock = socket.create_connection(("127.0.0.1", s.proxy.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall((max_frame_bytes - 1).to_bytes(4, "big"))
    started = time.perf_counter()
    sent = 0
    while time.perf_counter() - started < seconds and sent < max_frame_bytes - 2:
        for _ in range(1000):
            sock.send(b"\x00")
        sent += 1000
        await asyncio.sleep(0)
    rss1 = await settle(s, 1.0)
    sock.close()
    result = {"bytes_sent_in_1_byte_writes": sent, "seconds": round(time.perf_counter() - started, 1),
              "proxy_rss_growth_mib": round((rss1 - rss0) / MIB, 2),
              "growth_per_byte_sent": round((rss1 - rss0) / max(sent, 1), 2), "proxy_alive": s.alive}
    emit("trickle", **result)
    return result


async def big_frames_held(s: Stack, connections: int, max_frame_bytes: int) -> dict[str, Any]:
    """Connections that each send all but the last byte of a frame of max_frame_bytes - 1."""
    rss0 = await settle(s, 1.0)
    conns = [await connect(s.proxy.port) for _ in range(connections)]
    body = bytes(max_frame_bytes - 2)
    for _, w in conns:
        w.write((max_frame_bytes - 1).to_bytes(4, "big") + body)
        await w.drain()
    rss1 = await settle(s, 2.0)
    for _, w in conns:
        w.transport.abort()
    growth = rss1 - rss0
    result = {"connections": connections, "max_frame_bytes": max_frame_bytes,
              "proxy_rss_growth_mib": round(growth / MIB, 2),
              "growth_per_connection_over_max_frame": round(growth / connections / max_frame_bytes, 3),
              "proxy_alive": s.alive}
    emit("partial-max-frames", **result)
    return result


async def fill_topic(s: Stack, megabytes: int) -> None:
    batch = record_batch(1000, 1024)
    reader, writer = await connect(s.proxy.port)
    frame = produce_frame(TOPIC, 0, batch, "filler")
    for _ in range(megabytes * MIB // len(batch)):
        await round_trip(reader, writer, frame)
    writer.transport.abort()


async def never_reading_fetchers(s: Stack, connections: int, fetch_bytes: int, pipelined: int,
                                 seconds: float) -> dict[str, Any]:
    """Connections that each pipeline Fetch requests for `fetch_bytes` from offset 0 and never
    read a byte of the answers."""
    rss0 = await settle(s, 1.0)
    frame = fetch_frame(TOPIC, 0, 0, fetch_bytes, "never-reads")
    conns = []
    for _ in range(connections):
        sock = socket.create_connection(("127.0.0.1", s.proxy.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(frame * pipelined)
        conns.append(sock)
    await asyncio.sleep(seconds)
    rss1 = s.rss()
    spliced = s.proxy.metric("kafka_quota_proxy_spliced_bytes_total")
    fetches = s.proxy.metric("kafka_quota_proxy_requests_total", api="Fetch")
    fetch_bytes_out = s.proxy.metric("kafka_quota_proxy_response_bytes_total", api="Fetch")
    for sock in conns:
        sock.close()
    growth = rss1 - rss0
    result = {"connections": connections, "fetch_max_bytes": fetch_bytes, "pipelined": pipelined,
              "proxy_rss_growth_mib": round(growth / MIB, 2),
              "proxy_bytes_per_connection": round(growth / connections), "spliced_bytes": spliced,
              "fetch_requests_read": fetches, "fetch_responses_written_bytes": fetch_bytes_out,
              "proxy_alive": s.alive}
    emit("never-reading-fetchers", **result)
    return result


async def slow(s: Stack, slowloris_connections: int, max_frame_bytes: int) -> dict[str, Any]:
    await fill_topic(s, 64)
    return {
        "slowloris": await slowloris(s, slowloris_connections, max_frame_bytes, seconds=20, interval=2.0),
        "trickle": await trickle(s, max_frame_bytes, seconds=10),
        "partial_max_frames": await big_frames_held(s, 8, max_frame_bytes),
        "never_reading_fetchers": await never_reading_fetchers(s, 20, 32 * MIB, 5, seconds=5),
    }


# -- command line ---------------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.connections", description=__doc__.split("\n\n")[0])
    p.add_argument("run", choices=["hold", "flood", "slow", "all", "offer"])
    p.add_argument("--port", type=int, help="offer: the proxy's port (flood starts it)")
    p.add_argument("--connections", type=int, default=10_000, help="hold: idle connections")
    p.add_argument("--active", type=int, default=20, help="well-behaved connections measured")
    p.add_argument("--active-rate", type=float, default=25.0, help="requests a second per active connection")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=2000.0, help="flood: new connections a second")
    p.add_argument("--limit-rate", type=int, default=200, help="flood: connection_creation_rate")
    p.add_argument("--max-per-ip", type=int, default=500, help="flood: quota.max_connections_per_ip")
    p.add_argument("--slowloris", type=int, default=1000, help="slow: slowloris connections")
    p.add_argument("--max-frame-bytes", type=int, default=8 * MIB, help="slow: the proxy's max_frame_bytes")
    p.add_argument("--workers", type=int, help="the proxy's --workers (default: 2 for hold, 1 otherwise)")
    p.add_argument("--generators", type=int, default=4, help="flood: processes offering the connections")
    args = p.parse_args(argv)
    if args.run == "offer":
        raise_fd_limit()
        print(json.dumps(asyncio_run(offer(args.port, args.rate, args.seconds))), flush=True)
        return 0
    runs = ["hold", "flood", "slow"] if args.run == "all" else [args.run]
    for run in runs:
        if run == "hold":
            with stack(workers=args.workers or 2) as s:
                asyncio_run(hold(s, args.connections, args.active, args.active_rate, args.seconds))
        elif run == "flood":
            with stack(flood_config(args.limit_rate, args.max_per_ip), workers=args.workers or 1) as s:
                asyncio_run(flood(s, args.rate, args.seconds, args.limit_rate, args.max_per_ip,
                                  args.active, args.active_rate, args.generators))
        else:
            with stack({"max_frame_bytes": args.max_frame_bytes}, workers=args.workers or 1) as s:
                asyncio_run(slow(s, args.slowloris, args.max_frame_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
