"""bench.connections' stack and clients: a Tansu broker and the proxy as processes (Stack), and raw
Kafka clients over asyncio streams: idle connections, active ones at a steady rate (Active)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata.metadata import MetadataRequest

from bench.load import percentile
from bench.wire import METADATA_VERSION, api_versions_frame, produce_frame, record_batch
from devkit.processes import ProxyProcess
from devkit.tansu import Broker
from kafka_quota_proxy.protocol.headers import frame_request

TOPIC = "load"
OTHER_SOURCE = "127.0.0.2"  # the well-behaved clients' address during a flood (loopback is 127/8)
MIB = 1 << 20


def emit(what: str, **fields: Any) -> None:
    print(json.dumps({"measurement": what, **fields}), flush=True)


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to the hard one (the proxy and Tansu, started
    from here, inherit it); returns it. The hard limit itself needs CAP_SYS_RESOURCE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def metadata_frame(client_id: str) -> bytes:
    req = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)],
                          allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    return frame_request(req, METADATA_VERSION, 0, client_id)


@dataclass
class Stack:
    """Tansu and one proxy in front of it (one process, or a supervisor and its workers), with
    the topic the clients use."""

    broker: Broker
    proxy: ProxyProcess
    proxy_ps: psutil.Process = field(init=False)  # the process started: the proxy or its supervisor
    broker_ps: psutil.Process = field(init=False)

    def __post_init__(self) -> None:
        assert self.proxy.proc is not None and self.broker.proc is not None
        self.proxy_ps = psutil.Process(self.proxy.proc.pid)
        self.broker_ps = psutil.Process(self.broker.proc.pid)

    def serving(self) -> list[psutil.Process]:
        """The processes that hold client connections: the proxy, or its workers."""
        if self.proxy.workers == 1:
            return [self.proxy_ps]
        return [psutil.Process(pid) for pid in self.proxy.worker_pids()]

    def sample(self) -> dict[str, Any]:
        procs = self.serving()
        out = {"proxy_rss_mib": round(sum(p.memory_info().rss for p in procs) / MIB, 1),
               "proxy_fds": sum(p.num_fds() for p in procs),
               "broker_rss_mib": round(self.broker_ps.memory_info().rss / MIB, 1),
               "broker_fds": self.broker_ps.num_fds(),
               "connections_open": self.proxy.metric("kafka_quota_proxy_connections_open")}
        if len(procs) > 1:
            out["per_worker_fds"] = [p.num_fds() for p in procs]
            out["per_worker_rss_mib"] = [round(p.memory_info().rss / MIB, 1) for p in procs]
            others = [c for c in self.proxy_ps.children() if c.pid not in {p.pid for p in procs}]
            out["supervisor_and_store_rss_mib"] = round(
                sum(p.memory_info().rss for p in (self.proxy_ps, *others)) / MIB, 1)
        return out

    def rss(self) -> int:
        """The proxy's resident memory, summed over its workers."""
        return sum(int(p.memory_info().rss) for p in self.serving())

    @property
    def alive(self) -> bool:
        return self.proxy.proc is not None and self.proxy.proc.poll() is None


@contextlib.contextmanager
def stack(config: dict[str, Any] | None = None, partitions: int = 1, workers: int = 1) -> Iterator[Stack]:
    raise_fd_limit()
    broker = Broker().start()
    proxy = None
    try:
        node = broker.node_id()
        admin = AdminClient({"bootstrap.servers": broker.address})
        for f in admin.create_topics([NewTopic(TOPIC, partitions, 1)]).values():
            f.result(30)
        proxy = ProxyProcess(broker.address, node, {"log_level": "WARNING", "workers": workers,
                                                    **(config or {})})
        proxy.start()  # stopped below even when it fails to start in time
        yield Stack(broker, proxy)
    finally:
        if proxy is not None:
            proxy.stop()
        broker.stop()


async def round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frame: bytes,
                     timeout: float = 30.0) -> bytes:
    writer.write(frame)
    head = await asyncio.wait_for(reader.readexactly(4), timeout)
    body = await asyncio.wait_for(reader.readexactly(int.from_bytes(head, "big")), timeout)
    if body[:4] != frame[8:12]:
        raise RuntimeError(f"correlation id {body[:4].hex()}, expected {frame[8:12].hex()}")
    return head + body


async def connect(port: int, source: str | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0) if source else None)


async def open_idle(port: int, n: int,
                    concurrency: int = 200) -> tuple[list[asyncio.StreamWriter], list[str]]:
    """`n` connections, each after an ApiVersions and a Metadata round trip; and the failures."""
    gate = asyncio.Semaphore(concurrency)
    versions, metadata = api_versions_frame("idle"), metadata_frame("idle")

    async def one() -> asyncio.StreamWriter:
        async with gate:
            reader, writer = await connect(port)
            try:
                await round_trip(reader, writer, versions)
                await round_trip(reader, writer, metadata)
            except BaseException:
                writer.transport.abort()
                raise
            return writer
    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    writers = [w for w in results if isinstance(w, asyncio.StreamWriter)]
    failures = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return writers, failures


@dataclass
class Active:
    """Well-behaved clients: each connection alternates a Produce (acks=1, one 100-byte record)
    and a Metadata, one request at a time, paced at `rate` requests a second; round trips timed."""

    port: int
    connections: int
    rate: float
    source: str | None = None
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    async def open(self) -> Active:
        for _ in range(self.connections):
            self.conns.append(await connect(self.port, self.source))
        return self

    async def measure(self, seconds: float) -> dict[str, Any]:
        produce = produce_frame(TOPIC, 0, record_batch(1, 100), "active")
        metadata = metadata_frame("active")
        samples: list[float] = []
        errors: list[str] = []
        interval = 1.0 / self.rate

        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, offset: float) -> None:
            start = time.perf_counter() + offset
            n = 0
            while True:
                due = start + n * interval
                now = time.perf_counter()
                if due > now:
                    await asyncio.sleep(due - now)
                if time.perf_counter() - start >= seconds:
                    return
                sent = time.perf_counter()
                try:
                    await round_trip(reader, writer, produce if n % 2 == 0 else metadata)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors.append(f"{type(exc).__name__}: {exc}")
                    return
                samples.append(time.perf_counter() - sent)
                n += 1
        await asyncio.gather(*(run(r, w, i * interval / len(self.conns))
                               for i, (r, w) in enumerate(self.conns)))
        ms = sorted(s * 1000 for s in samples)
        return {"requests": len(ms), "requests_per_second": round(len(ms) / seconds, 1),
                "p50_ms": round(percentile(ms, 50), 2), "p99_ms": round(percentile(ms, 99), 2),
                "max_ms": round(ms[-1], 2) if ms else None, "errors": len(errors), "first_errors": errors[:3]}

    def close(self) -> None:
        for _, w in self.conns:
            w.transport.abort()
