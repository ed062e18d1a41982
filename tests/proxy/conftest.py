"""An in-process Proxy in front of a FakeBroker, all on the test's own event loop."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from devkit.processes import free_port
from kafka_quota_proxy.config import Settings, merge
from kafka_quota_proxy.proxy.server import Proxy
from tests.support.fake_broker import NODE_ID, FakeBroker, Handler, default_handler

CLIENT_ID = b"test-client"
# The event loops a test may run the proxy on: asyncio's, and uvloop, which the proxy runs on
# when installed (cli/main.py). Their transports differ where it matters here: uvloop starts
# reading a connection after connection_made whatever it asked; TLS shuts down differently.
LOOPS = ["asyncio", "uvloop"]


def run_on(loop: str, coro: Coroutine[Any, Any, None]) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(coro)
    else:
        asyncio.run(coro)


def request_frame(api_key: int, version: int, correlation_id: int, body: bytes = b"",
                  client_id: bytes = CLIENT_ID, flexible: bool = False) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    if flexible:
        header += b"\x00"  # no header tagged fields
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def list_groups(correlation_id: int) -> bytes:
    return request_frame(16, 0, correlation_id)


def produce_acks0_v3(correlation_id: int) -> bytes:
    # transactional_id null, acks 0, timeout 1000, no topics
    return request_frame(0, 3, correlation_id, struct.pack(">hhii", -1, 0, 1000, 0))


async def read_frame(reader: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    size = await asyncio.wait_for(reader.readexactly(4), timeout)
    return size + await asyncio.wait_for(reader.readexactly(struct.unpack(">i", size)[0]), timeout)


def correlation_id(frame: bytes) -> int:
    return int(struct.unpack_from(">i", frame, 4)[0])


async def is_closed(reader: asyncio.StreamReader, timeout: float = 5.0) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(1), timeout)
    except ConnectionError:
        return True
    return data == b""


class Harness:
    def __init__(self, broker: FakeBroker, proxy: Proxy, settings: Settings) -> None:
        self.broker = broker
        self.proxy = proxy
        self.settings = settings

    async def connect(self, port: int | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", port or self.settings.listen.port)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError("condition not met in time")
            await asyncio.sleep(0.01)

    def errors(self, kind: str) -> float:
        value = self.proxy.metrics.registry.get_sample_value(
            "kafka_quota_proxy_protocol_errors_total", {"kind": kind})
        return value or 0.0


@asynccontextmanager
async def running(handler: Handler = default_handler, **config: Any) -> AsyncIterator[Harness]:
    broker = await FakeBroker(handler).start()
    values = {"upstream": (f"127.0.0.1:{broker.port}",), "listen": f"127.0.0.1:{free_port()}",
              "node_ports": {NODE_ID: free_port()}, **config}
    from kafka_quota_proxy.config.settings import parse_values

    settings = merge(parse_values({k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}))
    try:
        async with serving(settings, broker) as h:
            yield h
    finally:
        await broker.stop()


@asynccontextmanager
async def serving(settings: Settings, broker: FakeBroker) -> AsyncIterator[Harness]:
    """A Proxy with these settings in front of `broker`, shut down afterwards."""
    proxy = Proxy(settings)
    await proxy.start()
    try:
        yield Harness(broker, proxy, settings)
    finally:
        await proxy.shutdown()
