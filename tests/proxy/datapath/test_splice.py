"""proxy/datapath/splice.py on real loopback TCP sockets, on uvloop and on asyncio's own loop: exactly the
bytes asked for, in order, whichever side holds things up; failures reported by side; nothing
leaked (descriptors, pipes) however it ends."""

from __future__ import annotations

import asyncio
import os
import random
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from kafka_quota_proxy.proxy.datapath.splice import PipePool, Splice, SpliceFailed, plain_socket_fd

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


@pytest.fixture(params=sorted(LOOPS))
def run(request: Any) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    def runner(coro: Coroutine[Any, Any, Any]) -> Any:
        loop = LOOPS[request.param]()
        try:
            return loop.run_until_complete(coro)
        finally:
            loop.close()
    return runner


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of non-blocking loopback TCP sockets."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    for s in (a, b):
        s.setblocking(False)
    return a, b


class Transport:
    """What a splice asks of the client transport: how much it still holds to write."""

    def __init__(self, buffered: int = 0) -> None:
        self.buffered = buffered

    def get_write_buffer_size(self) -> int:
        return self.buffered


class Ends:
    """broker_out -> src ... splice ... dst -> client_in."""

    def __init__(self) -> None:
        self.broker_out, self.src = tcp_pair()
        self.dst, self.client_in = tcp_pair()

    def close(self) -> None:
        for s in (self.broker_out, self.src, self.dst, self.client_in):
            s.close()


async def send_all(sock: socket.socket, data: bytes, piece: int = 1 << 20, pause: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    for at in range(0, len(data), piece):
        await loop.sock_sendall(sock, data[at:at + piece])
        if pause:
            await asyncio.sleep(pause)


async def receive(sock: socket.socket, size: int, delay: float = 0.0, piece: int = 1 << 20) -> bytes:
    loop = asyncio.get_running_loop()
    if delay:
        await asyncio.sleep(delay)
    got = bytearray()
    while len(got) < size:
        chunk = await loop.sock_recv(sock, min(piece, size - len(got)))
        if not chunk:
            break
        got += chunk
    return bytes(got)


def start_splice(ends: Ends, pool: PipePool, size: int, transport: Transport | None = None
                 ) -> tuple[Splice, asyncio.Future[SpliceFailed | None]]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[SpliceFailed | None] = loop.create_future()

    def finished(failure: SpliceFailed | None) -> None:
        assert not done.done(), "done called twice"
        done.set_result(failure)

    splice = Splice(loop, pool, ends.src.fileno(), ends.dst.fileno(), transport or Transport(), size,
                    finished)
    splice.start()
    return splice, done


@pytest.fixture
def waits(monkeypatch: Any) -> list[tuple[bool, bool]]:
    """What each splice waited for: (the broker's socket readable, the client's writable)."""
    seen: list[tuple[bool, bool]] = []
    watch = Splice._watch

    def recording(self: Splice, read: bool, write: bool) -> None:
        seen.append((read, write))
        watch(self, read, write)

    monkeypatch.setattr(Splice, "_watch", recording)
    return seen


def test_moves_exactly_the_bytes_asked_for_and_leaves_what_follows(run: Any, waits: list[tuple[bool, bool]]
                                                                   ) -> None:
    payload = random.Random(1).randbytes(3 * (1 << 20) + 17)
    after = b"the next response"

    async def scenario() -> None:
        ends, pool = Ends(), PipePool()
        before = open_fds()
        sender = asyncio.ensure_future(send_all(ends.broker_out, payload + after, piece=100_000, pause=0.002))
        splice, done = start_splice(ends, pool, len(payload))
        got = await asyncio.wait_for(receive(ends.client_in, len(payload)), 20)
        assert await asyncio.wait_for(done, 20) is None
        await sender
        assert got == payload and splice.moved == len(payload)
        assert (True, False) in waits  # the broker's bytes came in pieces: it waited for them
        # What follows stays in the broker's socket for the transport to read.
        assert await asyncio.wait_for(receive(ends.src, len(after)), 5) == after
        # The two duplicates are closed and the empty pipe is back in the pool.
        assert open_fds() == before + 2
        assert len(pool._free) == 1
        pool.close()
        assert open_fds() == before
        ends.close()
    run(scenario())


def test_a_slow_client_holds_the_splice_without_losing_bytes(run: Any, waits: list[tuple[bool, bool]]
                                                            ) -> None:
    payload = random.Random(2).randbytes(6 * (1 << 20))

    async def scenario() -> None:
        ends, pool = Ends(), PipePool()
        ends.dst.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        sender = asyncio.ensure_future(send_all(ends.broker_out, payload))
        _, done = start_splice(ends, pool, len(payload))
        # The client reads nothing for a while, then in small pieces.
        got = await asyncio.wait_for(receive(ends.client_in, len(payload), delay=0.3, piece=16384), 30)
        assert await asyncio.wait_for(done, 20) is None
        await sender
        assert got == payload
        assert (False, True) in waits  # it did wait for the client, and only for it
        pool.close()
        ends.close()
    run(scenario())


def test_waits_for_what_the_client_transport_still_holds(run: Any) -> None:
    payload = b"x" * 200_000

    async def scenario() -> None:
        ends, pool = Ends(), PipePool()
        transport = Transport(buffered=10)
        await send_all(ends.broker_out, payload)
        _, done = start_splice(ends, pool, len(payload), transport)
        await asyncio.sleep(0.2)
        ends.client_in.settimeout(0)
        with pytest.raises(BlockingIOError):  # nothing overtook the transport's own bytes
            ends.client_in.recv(1)
        ends.client_in.setblocking(False)
        transport.buffered = 0
        assert await asyncio.wait_for(receive(ends.client_in, len(payload)), 10) == payload
        assert await asyncio.wait_for(done, 5) is None
        pool.close()
        ends.close()
    run(scenario())


def test_the_broker_closing_mid_response_is_reported_as_the_brokers(run: Any) -> None:
    async def scenario() -> None:
        ends, pool = Ends(), PipePool()
        await send_all(ends.broker_out, b"y" * 100_000)
        ends.broker_out.close()
        before = open_fds()
        _, done = start_splice(ends, pool, 1 << 20)
        failure = await asyncio.wait_for(done, 5)
        assert isinstance(failure, SpliceFailed) and failure.side == "broker"
        assert failure.reason == "connection closed mid-response"
        # A pipe that may hold bytes is closed, not pooled.
        assert not pool._free and open_fds() == before
        for s in (ends.src, ends.dst, ends.client_in):
            s.close()
    run(scenario())


def test_the_client_gone_is_reported_as_the_clients(run: Any) -> None:
    async def scenario() -> None:
        ends, pool = Ends(), PipePool()
        ends.client_in.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        ends.client_in.close()  # linger 0: a reset
        await asyncio.sleep(0.05)
        sender = asyncio.ensure_future(send_all(ends.broker_out, b"z" * (4 << 20)))
        _, done = start_splice(ends, pool, 4 << 20)
        failure = await asyncio.wait_for(done, 5)
        assert isinstance(failure, SpliceFailed) and failure.side == "client"
        sender.cancel()
        for s in (ends.broker_out, ends.src, ends.dst):
            s.close()
    run(scenario())


def test_cancel_releases_everything_and_reports_nothing(run: Any) -> None:
    async def scenario() -> None:
        ends, pool = Ends(), PipePool()
        before = open_fds()
        await send_all(ends.broker_out, b"w" * 50_000)
        splice, done = start_splice(ends, pool, 1 << 20)  # waits for the rest
        await asyncio.sleep(0.05)
        splice.cancel()
        splice.cancel()  # twice is harmless
        await send_all(ends.broker_out, b"w" * 50_000)
        await asyncio.sleep(0.05)
        assert not done.done()
        assert open_fds() == before and not pool._free
        ends.close()
    run(scenario())


def test_no_descriptors_to_spare_raises_and_leaks_nothing(run: Any) -> None:
    async def scenario() -> None:
        ends, pool = Ends(), PipePool()
        pipe = pool.take()
        pool.give_back(pipe)
        before = open_fds()
        loop = asyncio.get_running_loop()
        with pytest.raises(OSError):
            Splice(loop, pool, ends.src.fileno(), 10_000_000, Transport(), 10, lambda failure: None)
        assert open_fds() == before and pool._free == [pipe]
        pool.close()
        ends.close()
    run(scenario())


def test_pipe_pool_reuses_and_keeps_at_most_its_limit() -> None:
    pool = PipePool(keep=1)
    before = open_fds()
    a, b = pool.take(), pool.take()
    assert a[2] >= 64 * 1024 and a[2] == b[2]
    pool.give_back(a)
    pool.give_back(b)  # over the limit: closed
    assert open_fds() == before + 2
    assert pool.take() == a
    pool.give_back(a)
    pool.close()
    assert open_fds() == before


def test_plain_socket_fd_only_for_plain_tcp() -> None:
    class Stub:
        def __init__(self, extra: dict[str, Any]) -> None:
            self.extra = extra

        def get_extra_info(self, name: str) -> Any:
            return self.extra.get(name)

    a, b = tcp_pair()
    assert plain_socket_fd(Stub({"socket": a})) == a.fileno()
    assert plain_socket_fd(Stub({"socket": a, "ssl_object": object()})) is None
    assert plain_socket_fd(Stub({})) is None
    assert plain_socket_fd(None) is None
    a.close()
    assert plain_socket_fd(Stub({"socket": a})) is None  # closed: fileno() is -1
    b.close()
